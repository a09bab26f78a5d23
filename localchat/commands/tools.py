"""``localchat tools``: the MCP servers of mcp.json and the built-in tools, as they start now.

Each server is shown running (with its tools), failed (with the reason: the last line its program
wrote to stderr, a timeout, a refused connection) or disabled, each tool with the name the model
sees and whether it is always allowed (``[tools.always_allow]`` in config.toml). A problem in
mcp.json is one line on stderr and the other servers are still listed. ``--json`` prints one
object for scripts. The exit status is 1 when a server failed or mcp.json has a problem, so the
command also serves as a check.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

DESCRIPTION_CHARS = 70


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tools", help="MCP servers and built-in tools: state, tools, what is always allowed",
        description="Start the MCP servers of mcp.json (in the config folder, in the mcpServers "
                    "format of Claude Desktop, Cursor, LM Studio and oterm) and list each one: "
                    "running with its tools, failed with the last line of its stderr, or "
                    "disabled; then the built-in tools ([tools] builtins in config.toml) and "
                    "what is always allowed. Exits 1 when a server failed or mcp.json has a "
                    "problem.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from localchat import paths
    from localchat.settings import load_config
    from localchat.tools.registry import ToolRegistry

    settings = load_config()
    with ToolRegistry.from_config(settings) as registry:
        if not args.json:
            for problem in registry.problems:
                sys.stderr.write(f"localchat: {problem}\n")
        registry.wait_started(settings.tools.start_timeout_s + 5)
        report = _report(registry, str(paths.mcp_config_file()))
    if args.json:
        sys.stdout.write(json.dumps(report, ensure_ascii=False) + "\n")
    else:
        _print(report, sys.stdout)
    failed = any(server["state"] == "failed" for server in report["servers"])
    return 1 if failed or report["problems"] else 0


def _report(registry: Any, mcp_file: str) -> dict[str, Any]:
    always = registry.settings.always_allowed
    servers = []
    for status in registry.statuses():
        servers.append({
            "name": status.name, "transport": status.transport, "target": status.target,
            "state": status.state, "error": status.error,
            "tools": [{"name": tool.name, "exposed_as": tool.exposed or tool.name,
                       "description": tool.description,
                       "always_allowed": always(status.name, tool.name)}
                      for tool in status.tools]})
    return {"mcp_config": mcp_file, "problems": registry.problems, "servers": servers,
            "always_allow": {server: list(names) for server, names
                             in registry.settings.always_allow.items()}}


def _print(report: dict[str, Any], out: TextIO) -> None:
    from localchat.settings.tools import BUILTIN_SERVER, BUILTIN_TOOLS
    from localchat.tools.results import one_line

    builtin, *servers = report["servers"]
    if servers:
        out.write(f"MCP servers ({report['mcp_config']}):\n")
    else:
        out.write(f"No MCP servers: put them in {report['mcp_config']} (the mcpServers format "
                  "of Claude Desktop, Cursor, LM Studio and oterm).\n")
    for server in servers:
        out.write(f"  {one_line(server['name'], 40)}  {server['state']}  "
                  f"{one_line(server['target'], 80)}\n")
        if server["error"]:
            out.write(f"    {one_line(server['error'], 200)}\n")
        _print_tools(server["tools"], out)
    on = [tool["name"] for tool in builtin["tools"]]
    off = [name for name in BUILTIN_TOOLS if name not in on]
    out.write(f"Built-in tools ({BUILTIN_SERVER}): "
              + (", ".join(on) + " on" if on else "none on")
              + (f"; {', '.join(off)} off (list them in [tools] builtins in config.toml)"
                 if off else "") + "\n")
    _print_tools(builtin["tools"], out)
    unknown = _saved_for_absent(report)
    if unknown:
        out.write("Always allowed in config.toml for servers or tools not running now: "
                  + ", ".join(unknown) + "\n")


def _print_tools(tools: list[dict[str, Any]], out: TextIO) -> None:
    from localchat.tools.results import one_line

    if not tools:
        return
    width = min(32, max(len(one_line(tool["exposed_as"], 32)) for tool in tools))
    for tool in tools:
        name = one_line(tool["exposed_as"], 32).ljust(width)
        description = one_line(tool["description"], DESCRIPTION_CHARS) if tool["description"] else ""
        mark = "  [always allowed]" if tool["always_allowed"] else ""
        out.write(f"    {name}  {description}{mark}".rstrip() + "\n")


def _saved_for_absent(report: dict[str, Any]) -> list[str]:
    """``server.tool`` entries of [tools.always_allow] that match no tool listed now."""
    from localchat.tools.results import one_line

    present = {(server["name"], tool["name"]) for server in report["servers"]
               for tool in server["tools"]}
    names = {server["name"] for server in report["servers"] if server["tools"]}
    return [one_line(f"{server}.{tool}", 80) for server, tools in report["always_allow"].items()
            for tool in tools if (server, tool) not in present
            and not (tool == "*" and server in names)]
