"""`localchat tools [--json]`: each server running with its tools or failed with the last line of
its stderr, the built-ins, and what is always allowed; mcp.json problems one line each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from heavy_imports import heavy_modules_loaded_by

from localchat import paths
from localchat.cli import main

SERVER = str(Path(__file__).with_name("mcp_servers.py"))


def _configure(servers: dict, config: str = "") -> None:
    paths.mcp_config_file().write_text(json.dumps({"mcpServers": servers}))
    if config:
        paths.config_file().write_text(config)


def test_no_mcp_json_lists_the_built_ins_and_says_where_servers_go(capsys):
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    assert f"No MCP servers: put them in {paths.mcp_config_file()}" in out
    assert "Built-in tools (builtin): none on; read_file, list_directory, run_command off" in out


def test_servers_tools_failures_and_always_allowed_are_listed(capsys):
    _configure({
        "notes": {"command": sys.executable, "args": [SERVER, "stdio"]},
        "github": {"command": sys.executable,
                   "args": ["-c", "import sys; sys.stderr.write('Error: GITHUB_TOKEN is not "
                                  "set\\n'); sys.exit(1)"]},
        "missing": {"command": "npx-is-not-installed"},
    }, '[tools]\nbuiltins = ["read_file"]\n[tools.always_allow]\nnotes = ["echo"]\n')
    assert main(["tools"]) == 1  # a server failed and mcp.json has a problem
    captured = capsys.readouterr()
    assert captured.err == (f"localchat: {paths.mcp_config_file()}: server 'missing': the program "
                            "'npx-is-not-installed' was not found on PATH; it was not started\n")
    lines = captured.out.splitlines()
    assert lines[0] == f"MCP servers ({paths.mcp_config_file()}):"
    assert lines[1].startswith("  notes  running  ")
    echo = next(line for line in lines if line.strip().startswith("echo"))
    assert "Return the text as it was given." in echo and echo.endswith("[always allowed]")
    failed = lines.index(next(line for line in lines if line.startswith("  github  failed")))
    assert lines[failed + 1] == "    the server exited while starting: Error: GITHUB_TOKEN is not set"
    assert "Built-in tools (builtin): read_file on; list_directory, run_command off" in captured.out


def test_json_gives_every_server_with_its_tools_for_scripts(capsys):
    _configure({"notes": {"command": sys.executable, "args": [SERVER, "stdio"]},
                "paused": {"command": sys.executable, "disabled": True}},
               '[tools.always_allow]\nnotes = ["*"]\n')
    assert main(["tools", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    states = {server["name"]: server["state"] for server in report["servers"]}
    assert states == {"builtin": "disabled", "notes": "running", "paused": "disabled"}
    notes = next(server for server in report["servers"] if server["name"] == "notes")
    add = next(tool for tool in notes["tools"] if tool["name"] == "add")
    assert add == {"name": "add", "exposed_as": "add", "description": "Add two integers.",
                   "always_allowed": True}
    assert report["always_allow"] == {"notes": ["*"]} and report["problems"] == []


def test_a_broken_mcp_json_is_one_line_and_the_command_still_answers(capsys):
    paths.mcp_config_file().write_text('{"mcpServers": {')
    assert main(["tools"]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "not valid JSON" in captured.err
    assert "No MCP servers" in captured.out


def test_listing_tools_loads_no_model_library(isolated_home):
    loaded, _ = heavy_modules_loaded_by(["tools"], isolated_home)
    assert "llama_cpp" not in loaded and "numpy" not in loaded
