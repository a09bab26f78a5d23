"""`localchat ask`: streamed output, JSON events, Ctrl+C, exit codes, routing, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fault_server import FaultServer, reply

from localchat.cli import main
from localchat.commands.ask_output import PlainText
from localchat.terminal import guard, visible


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_config(home, text):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)


def test_json_mode_streams_token_events_then_done_with_timings(test_model_path, capsys):
    code, out, _ = run_cli(capsys, "ask", "--json", "--model", str(test_model_path),
                           "--temperature", "0", "--max-tokens", "8", "Say hello.")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [e["event"] for e in events if e["event"] == "token"]
    done = events[-1]
    assert done["event"] == "done" and done["finish_reason"] in ("stop", "length")
    assert done["route"] == "local"
    for field in ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "ttft_ms",
                  "tpot_ms", "itl_p50_ms", "itl_p95_ms", "n_ctx", "n_ctx_used"):
        assert field in done["timings"]
    assert "".join(e["text"] for e in events if e["event"] == "token").strip()


def test_plain_mode_writes_reply_to_stdout_and_timings_to_stderr(test_model_path, capsys):
    code, out, err = run_cli(capsys, "ask", "--model", str(test_model_path), "--temperature", "0",
                             "--max-tokens", "8", "Say hello.")
    assert code == 0 and out.strip()
    assert "TTFT" in err and "TPOT" in err


def ask_process(model, *args, home):
    env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "localchat", "ask", "--model", str(model), "--temperature", "0",
         "--max-tokens", "400", *args, "Write a very long story about a lighthouse keeper."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_sigint_stops_the_reply_keeps_partial_text_and_exits_130(test_model_path, tmp_path):
    proc = ask_process(test_model_path, "--json", home=tmp_path)
    lines = []
    for line in proc.stdout:
        lines.append(json.loads(line))
        if sum(1 for e in lines if e["event"] == "token") == 5:
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=60)
    lines += [json.loads(line) for line in rest.splitlines()]
    assert proc.returncode == 130
    assert lines[-1]["event"] == "done" and lines[-1]["finish_reason"] == "aborted"
    # Tokens still queued at the stop are not delivered one by one: their text comes as one last
    # token (id -1) before "done", so the token texts still add up to the reply kept.
    tokens = [e for e in lines if e["event"] == "token" and e["id"] != -1]
    assert 5 <= len(tokens) <= 7  # stopped within a token of the signal
    assert lines[-1]["timings"]["predicted_n"] >= len(tokens)


def test_sigint_in_plain_mode_leaves_the_partial_reply_on_stdout(test_model_path, tmp_path):
    proc = ask_process(test_model_path, home=tmp_path)
    time.sleep(0.2)
    first = proc.stdout.read(20)  # wait until the reply streams
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert (first + rest).strip() and "[stopped]" in err and "Traceback" not in err


def test_the_text_a_stop_left_unread_is_written_before_the_end_in_both_outputs():
    import io

    from localchat.commands.ask_output import JsonEvents
    from localchat.events import Done, Token

    stopped = [Token("Once"), Done("Once upon a time", "aborted")]
    out, err = io.StringIO(), io.StringIO()
    plain = PlainText(out, err)
    for event in stopped:
        plain.event(event)
    assert out.getvalue() == "Once upon a time\n"
    out = io.StringIO()
    json_out = JsonEvents(out)
    for event in stopped:
        json_out.event(event)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e.get("text")) for e in events] == [
        ("token", "Once"), ("token", " upon a time"), ("done", None)]


def test_control_sequences_from_the_model_are_neutralised_on_a_terminal():
    assert visible("ok\x1b[2J\x07\x9b31m\nnext\t") == "ok^[[2J^G\\x9b31m\nnext\t"
    assert visible("a\u202eb\u200bc\udcff") == "a<U+202E>b<U+200B>c\\xff"

    class FakeTty:
        def __init__(self):
            self.data = ""

        def isatty(self):
            return True

        def write(self, text):
            self.data += text

        def flush(self):
            pass

    from localchat.events import Token

    out, err = FakeTty(), FakeTty()
    PlainText(guard(out), guard(err)).event(Token("\x1b]52;c;ZXZpbA==\x07"))  # as the CLI does
    assert "\x1b" not in out.data and "^[" in out.data


@pytest.mark.parametrize("args, message", [
    (["ask", "--model", "no-such-model", "hi"], "unknown model"),
    (["ask", "--model", "/nonexistent/file.gguf", "hi"], ""),
    (["ask", "--model", "smollm2-135m", "   "], "prompt is empty"),
])
def test_bad_input_is_one_line_and_nonzero(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_malformed_config_names_the_file_and_line(capsys, isolated_home):
    write_config(isolated_home, "[engine]\nn_ctx = 'big'\n")
    code, _, err = run_cli(capsys, "ask", "--model", "smollm2-135m", "hi")
    assert code == 1 and "config.toml:2" in err


def test_remote_off_sends_nothing_even_when_a_server_listens(test_model_path, capsys, isolated_home):
    with FaultServer([reply("remote text")]) as server:
        write_config(isolated_home, f'[remote]\nmode = "off"\nbase_url = "{server.base_url}"\n')
        code, out, _ = run_cli(capsys, "ask", "--json", "--model", str(test_model_path),
                               "--max-tokens", "4", "Prove the Riemann hypothesis step by step.")
        code_forced, out_forced, _ = run_cli(capsys, "ask", "--json", "--route", "remote",
                                             "--model", str(test_model_path), "Hi")
        assert server.connections == 0
    assert code == 0 and json.loads(out.splitlines()[-1])["route"] == "local"
    assert code_forced == 1 and "remote model is off" in out_forced


def test_route_remote_streams_from_the_real_server_and_says_so(test_model_path, llama_server,
                                                               capsys, isolated_home):
    write_config(isolated_home, f'[remote]\nmode = "auto"\nbase_url = "{llama_server}"\n')
    code, out, _ = run_cli(capsys, "ask", "--json", "--route", "remote", "--model",
                           str(test_model_path), "--max-tokens", "8", "Say hi.")
    events = [json.loads(line) for line in out.splitlines()]
    done = events[-1]
    assert code == 0 and done["event"] == "done"
    assert done["route"] == "remote" and done["route_reason"] == "user: remote"
    assert done["timings"]["ttft_ms"] > 0


def test_failed_automatic_escalation_falls_back_to_the_local_reply(test_model_path, capsys,
                                                                    isolated_home):
    from fault_server import Status

    with FaultServer([Status(500), Status(500)]) as server:
        write_config(isolated_home, f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n')
        prompt = ("Derive step by step, with a formal proof, the closed form of the sum of the "
                  "first n cubes, then prove it by induction and discuss three edge cases.")
        code, out, _ = run_cli(capsys, "ask", "--json", "--model", str(test_model_path),
                               "--max-tokens", "6", prompt)
    events = [json.loads(line) for line in out.splitlines()]
    done = events[-1]
    assert code == 0 and done["route"] == "local"
    assert any(e["event"] == "notice" and e["kind"] == "fallback" for e in events)
