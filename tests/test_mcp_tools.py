"""MCP servers as tools: real servers written with the mcp SDK, over stdio and over streamable
HTTP on 127.0.0.1, the well-behaved and the misbehaving (a crash mid-call, a hang, garbage on
stdout, 10 MB, terminal escapes): every outcome is a result the model reads and a notice the
user sees, never a traceback, and the other servers go on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localchat import paths
from localchat.reply.calls import ToolCall
from localchat.settings import Settings
from localchat.settings.remote import RemoteSettings
from localchat.settings.tools import ToolsSettings
from localchat.tools.registry import ToolRegistry
from tests.mcp_servers import ESCAPES

SERVER = str(Path(__file__).with_name("mcp_servers.py"))
STDIO = {"command": sys.executable, "args": [SERVER, "stdio"]}


def registry_for(folder: Path, servers: dict, remote: RemoteSettings | None = None,
                 **tools) -> ToolRegistry:
    path = folder / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    settings = Settings(tools=ToolsSettings(**tools), remote=remote or RemoteSettings())
    return ToolRegistry.from_config(settings, path)


def call(registry: ToolRegistry, name: str, timeout: float | None = None, cancel=None,
         max_chars: int | None = None, **arguments):
    return registry.call(ToolCall("abc123XYZ", name, arguments), timeout=timeout, cancel=cancel,
                         max_chars=max_chars)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_url(tmp_path_factory):
    """The test server over streamable HTTP on 127.0.0.1, for the whole module."""
    port = _free_port()
    log = (tmp_path_factory.mktemp("http") / "server.log").open("w")
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert process.poll() is None, "the HTTP test server exited"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:  # uvicorn waits for open streams: no need here
        process.kill()
        process.wait(5)
    log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory, http_url):
    """One registry with every kind of server, started once (servers take ~1 s each to start)."""
    folder = tmp_path_factory.mktemp("tools")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALCHAT_HOME", str(folder / "home"))
        registry = registry_for(folder, {
            "tools": STDIO,
            "crashy": STDIO,
            "noisy": {"command": sys.executable, "args": [SERVER, "stdio", "--banner"]},
            "broken": {"command": sys.executable,
                       "args": ["-c", "import sys; sys.stderr.write('boom: no API key set\\n'); "
                                      "sys.exit(2)"]},
            "missing": {"command": "no-such-mcp-server-program"},
            "web": {"url": http_url},
            "off": {"command": sys.executable, "args": [SERVER], "disabled": True},
        }, timeout_s=20)
        registry.start()
        assert registry.wait_started(60)
        yield registry
        registry.close()


def _status(registry, name):
    return next(s for s in registry.statuses() if s.name == name)


def test_servers_start_in_the_background_and_report_their_state(tmp_path):
    registry = registry_for(tmp_path, {"tools": STDIO})
    with registry:
        registry.start()  # returns at once: nobody waits for a server to come up
        assert _status(registry, "tools").state == "starting"
        assert registry.tools() == []
        assert registry.wait_started(60)
        status = _status(registry, "tools")
        assert status.state == "running" and status.transport == "stdio"
        assert {"echo", "add", "crash", "huge"} <= {tool.name for tool in status.tools}
        assert sys.executable in status.target


def test_each_server_is_running_failed_or_disabled_and_a_missing_program_is_a_problem_line(
        registry):
    states = {s.name: s.state for s in registry.statuses()}
    assert states == {"builtin": "disabled", "tools": "running", "crashy": "running",
                      "noisy": "running", "broken": "failed", "web": "running",
                      "off": "disabled"}
    assert _status(registry, "broken").error == "the server exited while starting: boom: no API key set"
    [problem] = registry.problems
    assert "mcp.json: server 'missing': the program 'no-such-mcp-server-program' was not found" \
        in problem


def test_a_call_over_stdio_and_over_http_returns_the_tools_answer(registry):
    for name in ("tools_echo", "web_echo"):
        result = call(registry, name, text="héllo")
        assert (result.content, result.is_error, result.notice) == ("héllo", False, "")
    assert call(registry, "tools_add", a=2, b=40).content == "42"


def test_tools_offered_by_two_servers_get_the_servers_name_and_specs_are_openai_functions(
        registry):
    names = {tool.exposed for tool in registry.tools()}
    assert {"tools_echo", "web_echo", "noisy_echo", "crashy_echo"} <= names and "echo" not in names
    spec = next(s for s in registry.specs() if s["function"]["name"] == "web_add")
    assert spec["type"] == "function"
    assert spec["function"]["parameters"]["required"] == ["a", "b"]
    assert registry.find("web.add").exposed == "web_add"


def test_a_tool_that_does_not_exist_is_an_error_the_model_can_read(registry):
    result = call(registry, "get_weather", city="Paris")
    assert result.is_error and result.content.startswith("error: there is no tool named get_weather")
    assert "tools_echo" in result.content and "get_weather" in result.notice


def test_arguments_that_do_not_fit_the_schema_are_refused_before_the_server_sees_them(registry):
    result = call(registry, "tools_add", a="two", b=3)
    assert result.is_error
    assert "do not fit the input schema of tools_add: 'two' is not of type 'integer' (at a)" \
        in result.content
    missing = call(registry, "tools_echo")
    assert "'text' is a required property" in missing.content


def test_a_server_that_hangs_times_out_and_keeps_serving(registry):
    result = call(registry, "tools_hang", timeout=1)
    assert result.is_error and "no answer within 1 s" in result.content
    assert result.notice.startswith("tools.hang: no answer within 1 s")
    assert call(registry, "tools_echo", text="still here").content == "still here"


def test_esc_cancels_a_running_call_at_once(registry):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    result = call(registry, "web_hang", timeout=30, cancel=cancel)
    assert time.monotonic() - started < 5
    assert result.is_error and "cancelled by the user" in result.content
    assert result.notice == "web.hang: cancelled"
    assert call(registry, "web_echo", text="after").content == "after"


def test_garbage_on_stdout_is_skipped_and_the_call_answers(registry):
    assert call(registry, "tools_garbage").content == "answered after the garbage"
    assert _status(registry, "tools").state == "running"
    assert call(registry, "noisy_echo", text="banner skipped").content == "banner skipped"


@pytest.mark.parametrize("name", ["tools_huge", "web_huge"])
def test_ten_megabytes_are_capped_with_a_note_for_the_model_and_a_notice(registry, name):
    result = call(registry, name, max_chars=5000)
    assert len(result.content) <= 5000 and not result.is_error
    assert "the result was cut here: 10,000,000 characters in all" in result.content
    assert "the result was cut to 5,000 characters" in result.notice


def test_terminal_escapes_in_a_result_are_made_inert(registry):
    result = call(registry, "tools_escapes")
    assert not any(ch in result.content for ch in "\x1b\x07\x9b\u202e")
    assert "plain red text" in result.content and "end" in result.content
    assert "pwned title" not in result.content  # an OSC title is removed, not shown
    assert "terminal control characters in the result were removed" in result.notice
    assert ESCAPES not in result.content


def test_a_tools_own_failure_is_an_error_result_with_its_message(registry):
    result = call(registry, "web_fails")
    assert result.is_error and "the database is locked" in result.content
    assert result.notice.startswith("web.fails: the tool reported an error")


def test_a_server_that_crashes_mid_call_fails_that_call_and_only_that_server(registry):
    result = call(registry, "crashy_crash")
    assert result.is_error
    assert "the server exited: fatal: crashed on purpose (during the call)" in result.content
    status = _status(registry, "crashy")
    assert status.state == "failed" and "fatal: crashed on purpose" in status.error
    assert "crashy_echo" not in {tool.exposed for tool in registry.tools()}
    assert call(registry, "tools_echo", text="others go on").content == "others go on"
    later = call(registry, "crashy.echo", text="x")
    assert later.is_error and "there is no tool named crashy.echo" in later.content
    registry.restart("crashy")
    assert registry.wait_started(60)
    assert call(registry, "crashy_echo", text="back").content == "back"


def test_a_server_that_never_answers_the_handshake_fails_after_the_start_timeout(tmp_path):
    silent = {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"]}
    with registry_for(tmp_path, {"silent": silent}, start_timeout_s=1) as registry:
        assert registry.wait_started(30)
        status = _status(registry, "silent")
        assert status.state == "failed" and "did not answer within 1 s" in status.error


def test_an_http_server_that_is_not_there_fails_with_the_reason(tmp_path):
    with registry_for(tmp_path, {"gone": {"url": f"http://127.0.0.1:{_free_port()}/mcp"}},
                      start_timeout_s=10) as registry:
        assert registry.wait_started(30)
        status = _status(registry, "gone")
        assert status.state == "failed" and status.error


def test_no_localchat_secret_reaches_a_servers_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_OPENAI_KEY", "sk-remote-secret")
    monkeypatch.setenv("LOCALCHAT_REMOTE_API_KEY", "sk-default-secret")
    monkeypatch.setenv("LOCALCHAT_API_KEY", "serve-secret")
    monkeypatch.setenv("UNRELATED_TOKEN", "not-on-the-allow-list")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-for-the-server")
    monkeypatch.setenv("LANG", "C.UTF-8")
    servers = {"tools": {**STDIO, "env": {"SERVER_SETTING": "on",
                                          "GITHUB_TOKEN": "${env:GITHUB_TOKEN}"}},
               "leaky": {**STDIO, "env": {"KEY": "${MY_OPENAI_KEY}"}}}
    with registry_for(tmp_path, servers, RemoteSettings(api_key_env="MY_OPENAI_KEY")) as registry:
        assert registry.wait_started(60)
        environment = json.loads(call(registry, "environment").content)
        [problem] = registry.problems
    assert "server 'leaky': env KEY asks for ${MY_OPENAI_KEY}, which holds a localchat secret" \
        in problem
    assert not {"MY_OPENAI_KEY", "LOCALCHAT_REMOTE_API_KEY", "LOCALCHAT_API_KEY",
                "UNRELATED_TOKEN"} & environment.keys()
    assert "secret" not in json.dumps(environment)
    assert environment["SERVER_SETTING"] == "on" and environment["GITHUB_TOKEN"] == "ghp-for-the-server"
    assert environment["LANG"] == "C.UTF-8" and environment["PATH"] == os.environ["PATH"]


def test_a_servers_stderr_goes_to_the_log_file_never_to_the_screen(tmp_path, capfd):
    with registry_for(tmp_path, {"tools": STDIO, "noisy": {
            "command": sys.executable, "args": [SERVER, "stdio", "--banner"]}}) as registry:
        assert registry.wait_started(60)
        call(registry, "tools_garbage")
        call(registry, "tools_add", a=1, b=1)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    logged = paths.log_file().read_text()
    assert "localchat.tools.server.tools" in logged and "test-tools server starting (stdio)" in logged
    assert "not an MCP message" in logged  # the banner and the garbage, skipped and noted


def test_closing_the_registry_ends_every_server_process(tmp_path):
    with registry_for(tmp_path, {"a": STDIO, "b": STDIO}) as registry:
        assert registry.wait_started(60)
        pids = [int(call(registry, f"{name}_pid").content) for name in ("a", "b")]
        if os.name == "posix":  # they start below the model's priority (under nice)
            ours = os.getpriority(os.PRIO_PROCESS, 0)
            assert all(os.getpriority(os.PRIO_PROCESS, pid) == min(19, ours + 10) for pid in pids)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_input_schema_the_checker_cannot_use_leaves_the_judgement_to_the_tool():
    from localchat.formats.validate import arguments_problem

    assert arguments_problem({"$ref": "#/definitions/missing"}, {"a": 1}) is None
    assert arguments_problem({"type": "no-such-type"}, {"a": 1}) is None
    long = arguments_problem({"type": "object", "properties": {"a": {"type": "integer"}}},
                             {"a": "x" * 100_000})
    assert long is not None and len(long) < 400
