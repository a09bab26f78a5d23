"""``localchat ask`` with tools: --allow-tool, the question on the terminal (and the denial
without one), ⚙ lines on stderr, tool_call / tool_result events in --json, a stored session's
calls and results; the remote model's calls here (the local model's come through the engine)."""

from __future__ import annotations

import json

import pytest
from fault_server import FaultServer, reply
from test_remote_tools import calls_stream

from localchat.cli import main
from localchat.commands import ask_tools
from localchat.store import Store


class FakeTty:
    """A terminal whose user types ``answers``; what was asked is in ``asked``."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def write(self, text: str) -> int:
        self.asked.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        return self.answers.pop(0) + "\n" if self.answers else ""

    def close(self) -> None:
        pass


@pytest.fixture
def remote_with_tools(isolated_home, tmp_path):
    """A scripted remote that reads notes.txt twice and then answers, configured with the
    read_file built-in; yields (server, path)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("tangerine")
    arguments = json.dumps({"path": str(notes)})
    script = [calls_stream(("call_1", "read_file", arguments)),
              calls_stream(("call_2", "read_file", arguments)), reply("It is tangerine.")]
    with FaultServer(script) as server:
        isolated_home.mkdir(parents=True, exist_ok=True)
        (isolated_home / "config.toml").write_text(
            f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n\n'
            '[tools]\nbuiltins = ["read_file"]\n')
        yield server, notes


def ask(capsys, model, *args):
    code = main(["ask", "--route", "remote", "--model", str(model), "--max-tokens", "16", *args,
                 "What is in notes.txt?"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_allowed_calls_run_and_json_has_tool_call_and_tool_result_events(
        remote_with_tools, test_model_path, capsys):
    code, out, _ = ask(capsys, test_model_path, "--json", "--allow-tool", "read_file")
    events = [json.loads(line) for line in out.splitlines()]
    kinds = [e["event"] for e in events if e["event"] not in ("token", "prefill")]
    assert code == 0 and kinds == ["tool_call", "tool_result", "tool_call", "tool_result", "done"]
    call, result = events[0], events[1]
    assert call["name"] == "read_file" and call["label"] == "builtin.read_file"
    assert call["arguments"] == {"path": str(remote_with_tools[1])}
    assert result["content"] == "tangerine" and result["is_error"] is False and result["id"] == "call_1"
    assert "".join(e["text"] for e in events if e["event"] == "token") == "It is tangerine."


def test_without_a_terminal_a_call_is_denied_and_the_user_told_how_to_allow_it(
        remote_with_tools, test_model_path, capsys, monkeypatch):
    monkeypatch.setattr(ask_tools, "open_tty", lambda: None)
    code, out, err = ask(capsys, test_model_path)
    assert code == 0 and out.strip() == "It is tangerine."
    assert "⚙ read_file(" in err and "--allow-tool read_file" in err
    assert "builtin.read_file: denied" in err


def test_the_terminal_is_asked_and_always_covers_the_next_call(remote_with_tools, test_model_path,
                                                             capsys, monkeypatch):
    tty = FakeTty("what?", "a")
    monkeypatch.setattr(ask_tools, "open_tty", lambda: tty)
    code, out, err = ask(capsys, test_model_path, "--json")
    results = [json.loads(line) for line in out.splitlines()]
    results = [e for e in results if e["event"] == "tool_result"]
    assert code == 0 and [r["content"] for r in results] == ["tangerine", "tangerine"]
    questions = [t for t in tty.asked if "⚙ run" in t]
    assert len(questions) == 1 and "builtin.read_file" in questions[0]  # "a": not asked again
    assert any("[y] once" in t for t in tty.asked[1:])  # "what?" was asked again


def test_a_stored_session_keeps_the_calls_and_results(remote_with_tools, test_model_path, capsys):
    code, _, _ = ask(capsys, test_model_path, "--allow-tool", "*", "--session", "notes")
    assert code == 0
    with Store.open() as store:
        turns = store.turns(store.find_session("notes").id)
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert turns[1].tool_calls[0].id == "call_1" and turns[2].tool_call_id == "call_1"
    assert turns[-1].content == "It is tangerine."


def test_a_tool_choice_no_tool_can_meet_is_a_one_line_error(test_model_path, capsys):
    code, _, err = ask(capsys, test_model_path, "--route", "local", "--tool-choice", "required")
    assert code == 1 and "no tools are available" in err and "Traceback" not in err
    code, _, err = ask(capsys, test_model_path, "--tool-choice", " ")
    assert code != 0 and "--tool-choice" in err


def test_the_local_model_forced_to_call_runs_the_tool_and_answers(test_model_path, capsys,
                                                                  isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('[tools]\nbuiltins = ["list_directory"]\n')
    code = main(["ask", "--model", str(test_model_path), "--temperature", "0", "--max-tokens",
                 "48", "--tool-choice", "list_directory", "--allow-tool", "*", "--json",
                 "List the files here."])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [e["event"] for e in events if e["event"] in ("tool_call", "tool_result", "done")]
    assert code == 0 and kinds == ["tool_call", "tool_result", "done"]
    assert events[-1]["timings"]["cache_n"] > 0  # the reply after the result reused the cache
    # No token carries the call's markup.
    assert "<tool_call>" not in "".join(e["text"] for e in events if e["event"] == "token")
