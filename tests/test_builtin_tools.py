"""localchat's own tools (read_file, list_directory, run_command): off until listed, the same
argument checks, limits and error shapes as MCP tools, and run_command ends with its children."""

from __future__ import annotations

import os
import threading
import time

import pytest

from localchat.reply.calls import ToolCall
from localchat.settings.tools import ToolsSettings
from localchat.tools.registry import ToolRegistry

ALL = ("read_file", "list_directory", "run_command")


@pytest.fixture
def registry():
    with ToolRegistry(settings=ToolsSettings(builtins=ALL),
                      secrets=frozenset({"LOCALCHAT_API_KEY"})) as registry:
        yield registry


def run(registry, name, timeout=None, cancel=None, **arguments):
    return registry.call(ToolCall("abc123XYZ", name, arguments), timeout=timeout, cancel=cancel)


def test_built_ins_are_off_until_listed():
    with ToolRegistry() as registry:
        assert registry.tools() == [] and registry.statuses()[0].state == "disabled"
        assert "no tools are available" in run(registry, "read_file", path="x").content
    with ToolRegistry(settings=ToolsSettings(builtins=("read_file",))) as registry:
        assert [t.exposed for t in registry.tools()] == ["read_file"]
        assert registry.statuses()[0].state == "running"


def test_read_file_returns_the_text_or_a_range_of_lines(registry, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("one\ntwo\nthree\nfour\n")
    assert run(registry, "read_file", path=str(path)).content == "one\ntwo\nthree\nfour\n"
    assert run(registry, "read_file", path=str(path), start_line=2, max_lines=2).content == \
        "two\nthree\n"


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "does not exist"),
    (lambda p: (p.mkdir(), p)[1], "is a folder (list_directory lists folders)"),
    (lambda p: (p.write_bytes(b"\x7fELF\0\0\1"), p)[1], "is not a text file"),
    (lambda p: (os.mkfifo(p), p)[1], "is not a regular file"),  # would block for ever
])
def test_read_file_failures_are_errors_the_model_reads(registry, tmp_path, make, message):
    path = make(tmp_path / "target")
    result = run(registry, "read_file", path=str(path))
    assert result.is_error and message in result.content
    assert result.notice.startswith("builtin.read_file: ")


def test_list_directory_marks_folders_and_sizes(registry, tmp_path):
    folder = tmp_path / "listed"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("hello")
    assert run(registry, "list_directory", path=str(folder)).content == "a.txt  5 bytes\nsub/"


def test_run_command_returns_output_and_exit_status(registry):
    ok = run(registry, "run_command", command="echo hello; echo oops >&2")
    assert ok.content == "hello\noops\n[exit status 0]" and not ok.is_error
    failed = run(registry, "run_command", command="exit 3")
    assert failed.content == "[exit status 3]" and failed.is_error


def test_run_command_never_sees_a_localchat_secret(registry, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_API_KEY", "serve-secret")
    result = run(registry, "run_command", command="env")
    assert "serve-secret" not in result.content and "PATH=" in result.content


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_command_that_runs_too_long_is_killed_with_its_children(registry, tmp_path):
    pidfile = tmp_path / "pid"
    result = run(registry, "run_command", timeout=1,
                 command=f"sh -c 'echo $$ > {pidfile}; exec sleep 60' & wait")
    assert result.is_error and "no answer within 1 s" in result.content
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)


def test_esc_stops_a_command(registry):
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    result = run(registry, "run_command", command="sleep 30", cancel=cancel)
    assert result.is_error and result.notice == "builtin.run_command: cancelled"


def test_arguments_are_checked_against_the_built_ins_schemas(registry):
    assert "'command' is a required property" in run(registry, "run_command").content
    extra = run(registry, "list_directory", path=".", recursive=True)
    assert "Additional properties are not allowed ('recursive' was unexpected)" in extra.content
    assert "0 is less than the minimum of 1" in run(registry, "read_file", path="x",
                                                    start_line=0).content


def test_a_huge_output_is_capped_for_the_model(registry):
    result = registry.call(ToolCall("abc123XYZ", "run_command",
                                    {"command": "head -c 3000000 /dev/zero | tr '\\0' a"}),
                           max_chars=2000)
    assert len(result.content) <= 2000 and "3,000,0" in result.content
    assert "cut to 2,000 characters" in result.notice


def test_closing_twice_is_harmless(tmp_path):
    # The app closes its services' registry, and so may whoever else held it.
    registry = ToolRegistry(settings=ToolsSettings(builtins=("read_file",)))
    registry.start()
    (tmp_path / "a.txt").write_text("alpha")
    assert "alpha" in run(registry, "read_file", path=str(tmp_path / "a.txt")).content
    registry.close()
    registry.close()
