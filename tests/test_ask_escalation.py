"""``ask --route auto`` when the real local model's reply is handed over part-way: the output
says the local text was superseded (plain text: a marker line; ``--json``: a ``superseded``
event) and the remote gets the conversation without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fault_server import FaultServer, Status, reply

from localchat.cli import main

pytestmark = pytest.mark.model

# Any real start is "uncertain" against these limits: the hand-over comes at the 4th token.
EAGER = "[remote.confidence]\nmin_tokens = 4\nmax_entropy = 0.0001\n"


def ask(capsys, model: Path, home: Path, base_url: str, *args: str) -> tuple[int, str, str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{base_url}"\n' + EAGER)
    code = main(["ask", "-m", str(model), "--temperature", "0", "--max-tokens", "24", *args,
                 "What is the capital of France?"])
    out, err = capsys.readouterr()
    return code, out, err


def test_plain_output_marks_the_local_start_superseded_before_the_remote_answer(
        capsys, test_model_path, isolated_home):
    with FaultServer([reply("Paris.")]) as server:
        code, out, err = ask(capsys, test_model_path, isolated_home, server.base_url)
        sent = server.requests[0].body["messages"]
    assert code == 0
    local, marker, answer = out.split("\n", 2)
    assert local and marker == "[local reply superseded; the remote model's answer follows]"
    assert answer == "Paris.\n"
    assert "uncertain start" in err and "route remote (auto: low-confidence: uncertain start" in err
    assert sent == [{"role": "user", "content": "What is the capital of France?"}]


def test_json_output_sets_the_local_start_aside_and_restores_it_when_the_remote_fails(
        capsys, test_model_path, isolated_home):
    with FaultServer([reply("Paris.")]) as server:
        code, out, _ = ask(capsys, test_model_path, isolated_home, server.base_url, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    kinds = [e["event"] for e in events]
    assert code == 0 and kinds.index("superseded") < kinds.index("notice")
    local = "".join(e["text"] for e in events[:kinds.index("superseded")] if e["event"] == "token")
    assert events[kinds.index("superseded")]["text"] == local and local
    remote = "".join(e["text"] for e in events[kinds.index("superseded"):] if e["event"] == "token")
    assert remote == "Paris." and events[-1]["route"] == "remote"

    with FaultServer([Status(500), Status(500)]) as server:
        code, out, _ = ask(capsys, test_model_path, isolated_home, server.base_url, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    kinds = [e["event"] for e in events]
    # The kept local start ends "aborted" (the hand-over stopped it), but the user did not.
    assert code == 0
    # The reply kept: the local start, restored, then what the local model wrote between the
    # hand-over's decision and its stop (not shown before), as one last token.
    after = kinds[kinds.index("retract"):]
    assert after in (["retract", "restore", "notice", "done"],
                     ["retract", "restore", "notice", "token", "done"])
    assert events[kinds.index("restore")]["text"] == events[kinds.index("superseded")]["text"]
    assert events[-1]["route"] == "local" and events[-1]["route_reason"].startswith("fallback:")
    assert events[-1]["timings"]["fell_back"] is True
