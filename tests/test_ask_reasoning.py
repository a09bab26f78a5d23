"""`localchat ask` with reasoning: thinking events apart from the answer, on stderr in plain mode,
dropped with --hide-thinking, and the --think switch (the test model under a Qwen3-style template,
and a scripted remote streaming reasoning_content)."""

from __future__ import annotations

import io
import json

import pytest
import tomli_w
from fault_server import FaultServer, Stream, chunk, usage_chunk
from reasoning_templates import THINKING
from test_remote_reasoning import reasoning_chunk

from localchat.cli import main
from localchat.commands.ask_output import PlainText, summary_line
from localchat.events import Done, Thinking, Timings, Token

pytestmark = pytest.mark.model


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def thinker(isolated_home, test_model_path) -> str:
    """A registry entry: the test model with a template that opens <think> (Qwen3-Thinking style)."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    entry = {"path": str(test_model_path), "chat_template": THINKING, "n_ctx": 1024}
    (isolated_home / "models.toml").write_text(tomli_w.dumps({"models": {"thinker": entry}}))
    return "thinker"


def test_json_mode_emits_thinking_events_and_tokens_only_for_the_answer(thinker, capsys):
    code, out, _ = run_cli(capsys, "ask", "--json", "--model", thinker, "--temperature", "0",
                           "--max-tokens", "8", "Hi!")

    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert "".join(e["text"] for e in events if e["event"] == "thinking").strip()
    assert "".join(e["text"] for e in events if e["event"] == "token") == ""
    timings = events[-1]["timings"]
    assert timings["thinking_n"] == timings["predicted_n"] == 8
    assert timings["time_to_answer_ms"] == 0 and timings["ttft_ms"] > 0


def test_hide_thinking_drops_the_reasoning(thinker, capsys):
    code, out, _ = run_cli(capsys, "ask", "--json", "--hide-thinking", "--model", thinker,
                           "--temperature", "0", "--max-tokens", "4", "Hi!")

    assert code == 0 and not any(json.loads(line)["event"] == "thinking" for line in out.splitlines())


def test_plain_mode_prints_reasoning_on_stderr_and_only_the_answer_on_stdout(thinker, capsys):
    code, out, err = run_cli(capsys, "ask", "--model", thinker, "--temperature", "0",
                             "--max-tokens", "8", "Hi!")

    assert code == 0 and out.strip() == ""  # the model never finished thinking
    reasoning = err.split("TTFT")[0].strip()
    assert reasoning and "no answer after 8 tok of thinking" in err


def test_think_switch_on_a_model_without_one_is_a_one_line_notice(test_model_path, capsys):
    code, out, err = run_cli(capsys, "ask", "--think", "off", "--model", str(test_model_path),
                             "--temperature", "0", "--max-tokens", "4", "Hi!")

    assert code == 0 and out.strip()
    assert "has no thinking switch; --think off is ignored" in err
    assert "Traceback" not in err


def test_bad_think_value_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", "--think", "maybe", "Hi"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err


def test_remote_reasoning_content_reaches_ask_json_as_thinking(test_model_path, capsys, isolated_home):
    script = Stream([reasoning_chunk("Adding."), chunk("4."), chunk(finish_reason="stop"),
                     usage_chunk(5, 3), "[DONE]"])
    with FaultServer([script]) as server:
        isolated_home.mkdir(parents=True, exist_ok=True)
        (isolated_home / "config.toml").write_text(
            f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n')
        code, out, _ = run_cli(capsys, "ask", "--json", "--route", "remote", "--model",
                               str(test_model_path), "2+2?")

    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [e["text"] for e in events if e["event"] == "thinking"] == ["Adding."]
    assert [e["text"] for e in events if e["event"] == "token"] == ["4."]
    assert events[-1]["timings"]["thinking_n"] == 1


def test_plain_text_dims_reasoning_on_a_terminal_and_ends_it_before_the_answer():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stdout, stderr = Terminal(), Terminal()
    out = PlainText(stdout, stderr)
    for event in (Thinking("hmm"), Thinking("\x1b]0;x"), Token("Yes."),
                  Done("hmm</think>Yes.", "stop", Timings(), "hmm")):
        out.event(event)

    assert stderr.getvalue().startswith("\x1b[2mhmm\x1b[22m\x1b[2m^[]0;x\x1b[22m\n")  # dim, neutralised
    assert stdout.getvalue() == "Yes.\n"


def test_summary_line_shows_when_the_answer_began():
    line = summary_line(Timings(ttft_ms=180, time_to_answer_ms=4200, thinking_n=310, predicted_n=400))
    assert line.startswith("TTFT 180 ms · answer 4.2 s after 310 tok of thinking · TPOT")


def test_a_bad_thinking_setting_names_the_file_line_and_choices(capsys, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('[sampling]\nthinking = "maybe"\n')

    code, _, err = run_cli(capsys, "ask", "Hi")

    assert code == 1
    assert err.strip().endswith('config.toml:2: sampling.thinking must be "auto" or "on" or "off", '
                                "not 'maybe'")
    assert len(err.strip().splitlines()) == 1
