"""mcp.json as Claude Desktop, Cursor, LM Studio, oterm and VS Code write it: each bad entry is one
line naming the file and the server, and the other servers still start."""

from __future__ import annotations

import json
import os
import sys

import pytest

from localchat import paths
from localchat.tools.config import load_mcp_config
from localchat.tools.environment import child_environment


def write(data) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    paths.mcp_config_file().write_text(text)


def test_no_file_means_no_servers_and_no_problems():
    assert load_mcp_config() == ([], [])


def test_claude_desktops_stdio_entry_and_cursors_url_entry_are_read():
    write({"mcpServers": {
        "filesystem": {"command": sys.executable, "args": ["-m", "server", "~/notes"],
                       "env": {"LOG_LEVEL": "debug", "PORT": 8080, "VERBOSE": True}},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
        "legacy": {"url": "http://127.0.0.1:9000/sse"},
        "explicit": {"type": "sse", "url": "http://127.0.0.1:9001/events"},
        "vs-code-style": {"type": "http", "url": "http://127.0.0.1:9002/mcp"},
        "paused": {"command": sys.executable, "disabled": True, "icon": "📁"},
    }})
    servers, problems = load_mcp_config()
    assert problems == []
    by_name = {s.name: s for s in servers}
    fs = by_name["filesystem"]
    assert (fs.transport, fs.command, fs.args) == ("stdio", sys.executable, ("-m", "server", "~/notes"))
    assert fs.env == {"LOG_LEVEL": "debug", "PORT": "8080", "VERBOSE": "true"}
    assert (by_name["remote"].transport, by_name["remote"].headers) == (
        "http", {"Authorization": "Bearer x"})
    assert by_name["legacy"].transport == by_name["explicit"].transport == "sse"
    assert by_name["vs-code-style"].transport == "http"
    assert by_name["paused"].disabled
    assert "Bearer" not in repr(by_name["remote"]) and by_name["remote"].describe() == \
        "https://example.com/mcp"


def test_vs_codes_servers_key_is_read_too():
    write({"servers": {"fs": {"type": "stdio", "command": sys.executable}}})
    [server], problems = load_mcp_config()
    assert (server.name, problems) == ("fs", [])


def test_a_file_that_does_not_parse_is_one_line_naming_the_file_and_line():
    write('{\n  "mcpServers": {\n    "fs": {"command": "npx",}\n  }\n}\n')
    servers, [problem] = load_mcp_config()
    assert servers == []
    assert problem.startswith(f"{paths.mcp_config_file()}:3: not valid JSON")
    assert problem.endswith("no MCP server was started") and "\n" not in problem


@pytest.mark.parametrize("entry, reason", [
    ({"command": "no-such-program-here"}, "the program 'no-such-program-here' was not found on PATH"),
    ({"command": "/nowhere/server"}, "the program /nowhere/server does not exist or is not executable"),
    ({"command": sys.executable, "args": "--stdio"}, "'args' must be a list of strings"),
    ({"command": sys.executable, "env": {"A": ["x"]}}, "'env' must be an object of strings"),
    ({"command": sys.executable, "cwd": "/no/such/folder"}, "'cwd' /no/such/folder is not a folder"),
    ({"url": "ftp://example.com"}, "'url' must start with http:// or https://"),
    ({"command": sys.executable, "url": "http://x"}, "give either 'command'"),
    ({"type": "websocket", "url": "ws://x"}, "unknown type 'websocket'"),
    ({}, "needs a 'command' to run or a 'url' to connect to"),
    ("npx server", "the entry must be an object"),
])
def test_a_wrong_entry_is_one_line_naming_file_and_server_and_the_others_still_load(entry, reason):
    write({"mcpServers": {"bad": entry, "good": {"command": sys.executable}}})
    servers, [problem] = load_mcp_config()
    assert [s.name for s in servers] == ["good"]
    assert problem.startswith(f"{paths.mcp_config_file()}: server 'bad': {reason}")
    assert problem.endswith("; it was not started") and "\n" not in problem


def test_builtin_is_a_reserved_server_name():
    write({"mcpServers": {"builtin": {"command": sys.executable}}})
    _, [problem] = load_mcp_config()
    assert "server 'builtin': the name 'builtin' is localchat's own tools'" in problem


def test_a_relative_program_and_cwd_are_found_beside_mcp_json():
    folder = paths.config_dir() / "servers"
    folder.mkdir()
    program = folder / "run.sh"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    write({"mcpServers": {"local": {"command": "./run.sh", "cwd": "servers"}}})
    [server], problems = load_mcp_config()
    assert problems == [] and server.cwd == str(folder)


def test_environment_variables_fill_in_tokens_but_never_localchats_secrets(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-1")
    monkeypatch.setenv("MY_REMOTE_KEY", "sk-2")
    write({"mcpServers": {
        "github": {"command": sys.executable, "env": {"GITHUB_TOKEN": "${env:GITHUB_TOKEN}"}},
        "api": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
        "thief": {"url": "https://example.com/mcp", "headers": {"X-Key": "${MY_REMOTE_KEY}"}},
        "unset": {"command": sys.executable, "env": {"T": "${env:NOT_SET_ANYWHERE}"}},
    }})
    servers, problems = load_mcp_config(secrets=frozenset({"MY_REMOTE_KEY"}))
    by_name = {s.name: s for s in servers}
    assert by_name["github"].env == {"GITHUB_TOKEN": "ghp-1"}
    assert by_name["api"].headers == {"Authorization": "Bearer ghp-1"}
    assert len(problems) == 2
    assert "server 'thief': header X-Key asks for ${MY_REMOTE_KEY}, which holds a localchat secret" \
        in problems[0]
    assert "server 'unset': env T asks for ${NOT_SET_ANYWHERE}, which is not set" in problems[1]


def test_a_childs_environment_is_the_allow_list_plus_its_own_and_no_secret(monkeypatch):
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws")
    monkeypatch.setenv("LOCALCHAT_API_KEY", "serve")
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pass@proxy:3128")
    env = child_environment({"SERVER_MODE": "read-only"}, frozenset({"LOCALCHAT_API_KEY"}))
    assert env["LANG"] == "de_DE.UTF-8" and env["PATH"] == os.environ["PATH"]
    assert env["SERVER_MODE"] == "read-only"
    assert not {"AWS_SECRET_ACCESS_KEY", "LOCALCHAT_API_KEY", "HTTPS_PROXY"} & env.keys()


def test_a_secret_named_like_a_variable_the_sdk_always_passes_is_blanked(monkeypatch):
    monkeypatch.setenv("USER", "secret-user")
    assert child_environment(None, frozenset({"USER"}))["USER"] == ""
