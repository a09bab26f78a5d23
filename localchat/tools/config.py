"""``mcp.json``: the MCP servers a user already has, in the format other apps use.

Claude Desktop, Cursor, LM Studio and oterm all read ``{"mcpServers": {NAME: ENTRY}}``, so a user
copies theirs into the config folder (``paths.mcp_config_file()``). An entry is either

- a program spoken to over stdio: ``command``, ``args`` (strings), ``env`` (an object of
  strings), ``cwd``; or
- a server over HTTP: ``url`` and ``headers`` (streamable HTTP, or the older SSE when ``type`` is
  ``"sse"`` or the URL ends in ``/sse``).

``type`` (or ``transport``) may say which; VS Code's ``{"servers": ...}`` is read the same way;
``"disabled": true`` keeps an entry without starting it; keys other apps add (``icon``,
``autoApprove``...) are ignored. Values may use ``${env:NAME}`` or ``${NAME}`` (as Cursor and VS
Code allow) to take a token from the environment, never one of localchat's own secrets.

:func:`load_mcp_config` never raises for what is in the file: a file that does not parse gives
one problem line naming the file and no servers; an entry that is wrong, or names a program that
is not there, gives one line naming the file and the server, and the other servers start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from localchat import paths
from localchat.settings import url_problem
from localchat.settings.tools import BUILTIN_SERVER
from localchat.terminal import visible

Transport = Literal["stdio", "http", "sse"]

_TYPES: dict[str, Transport] = {
    "stdio": "stdio", "http": "http", "streamable-http": "http", "streamable_http": "http",
    "streamableHttp": "http", "sse": "sse",
}
_VARIABLE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server from mcp.json, checked. ``headers`` and ``env`` may hold tokens: they are
    never shown (:meth:`describe` leaves them out)."""

    name: str
    transport: Transport
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    disabled: bool = False

    def describe(self) -> str:
        """How the server is reached, for a listing: the command line, or the URL."""
        if self.transport == "stdio":
            return visible(" ".join([self.command, *self.args]), newlines=False)
        return visible(self.url, newlines=False)

    def __repr__(self) -> str:
        return f"<ServerConfig {self.name} {self.transport} {self.describe()!r}>"


class EntryProblem(Exception):
    """What is wrong with one entry (the message names no file or server: the caller adds them)."""


def load_mcp_config(path: Path | None = None, secrets: frozenset[str] = frozenset()
                    ) -> tuple[list[ServerConfig], list[str]]:
    """(servers, problems) from mcp.json (default: ``paths.mcp_config_file()``); no file means
    no servers. ``secrets`` are environment variables no entry may draw a value from."""
    path = path or paths.mcp_config_file()
    if not path.exists():
        return [], []
    where = visible(str(path), newlines=False)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return [], [f"{where}: not a UTF-8 text file; no MCP server was started"]
    except OSError as exc:
        return [], [f"{where}: cannot read: {exc.strerror or exc}; no MCP server was started"]
    except json.JSONDecodeError as exc:
        return [], [f"{where}:{exc.lineno}: not valid JSON ({exc.msg}); no MCP server was started"]
    except RecursionError:
        return [], [f"{where}: nested too deeply; no MCP server was started"]
    entries = _entries(data)
    if entries is None:
        return [], [f'{where}: expected {{"mcpServers": {{...}}}}; no MCP server was started']
    servers, problems = [], []
    for name, entry in entries.items():
        shown = visible(name, newlines=False)
        try:
            servers.append(_server(name, entry, path.parent, secrets))
        except EntryProblem as exc:
            problems.append(f"{where}: server '{shown}': {exc}; it was not started")
    return servers, problems


def _entries(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    for key in ("mcpServers", "servers"):
        if key in data:
            return data[key] if isinstance(data[key], dict) else None
    return {} if not data else None


def _server(name: str, entry: Any, folder: Path, secrets: frozenset[str]) -> ServerConfig:
    if not name.strip() or any(ch in name for ch in "\x00\n\r"):
        raise EntryProblem("a server needs a name")
    if name == BUILTIN_SERVER:
        raise EntryProblem(f"the name '{BUILTIN_SERVER}' is localchat's own tools'; rename it")
    if not isinstance(entry, dict):
        raise EntryProblem("the entry must be an object")
    transport = _transport(entry)
    disabled = entry.get("disabled") is True
    if transport == "stdio":
        env = {key: _expand(value, secrets, f"env {key}") for key, value in
               _string_map(entry, "env").items()}
        cwd = _cwd(entry, folder)
        command = _expand(_string(entry, "command"), secrets, "command")
        args = tuple(_expand(arg, secrets, "args") for arg in _strings(entry, "args"))
        if not command:
            raise EntryProblem("'command' is empty")
        if not disabled:
            _check_program(command, env, cwd or str(folder))
        return ServerConfig(name, "stdio", command=command, args=args, env=env, cwd=cwd,
                            disabled=disabled)
    url = _expand(_string(entry, "url"), secrets, "url")
    problem = url_problem(url)
    if problem:
        raise EntryProblem(f"'url' {problem}")
    headers = {key: _expand(value, secrets, f"header {key}") for key, value in
               _string_map(entry, "headers").items()}
    if transport == "http" and "type" not in entry and "transport" not in entry \
            and url.rstrip("/").endswith("/sse"):
        transport = "sse"
    return ServerConfig(name, transport, url=url, headers=headers, disabled=disabled)


def _transport(entry: dict[str, Any]) -> Transport:
    kind = entry.get("type", entry.get("transport"))
    if kind is not None:
        if not isinstance(kind, str) or kind not in _TYPES:
            raise EntryProblem(f"unknown type {kind!r} (use \"stdio\", \"http\" or \"sse\")")
        if _TYPES[kind] == "stdio" and "command" not in entry:
            raise EntryProblem("a stdio server needs a 'command'")
        if _TYPES[kind] != "stdio" and "url" not in entry:
            raise EntryProblem(f"a {kind} server needs a 'url'")
        return _TYPES[kind]
    if "command" in entry and "url" in entry:
        raise EntryProblem("give either 'command' (a program) or 'url' (a server), not both")
    if "command" in entry:
        return "stdio"
    if "url" in entry:
        return "http"
    raise EntryProblem("needs a 'command' to run or a 'url' to connect to")


def _string(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise EntryProblem(f"'{key}' must be a string")
    return value


def _strings(entry: dict[str, Any], key: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EntryProblem(f"'{key}' must be a list of strings")
    return value


def _string_map(entry: dict[str, Any], key: str) -> dict[str, str]:
    """An object of strings; numbers and booleans are taken as the text JSON writes for them."""
    value = entry.get(key) or {}
    if not isinstance(value, dict):
        raise EntryProblem(f"'{key}' must be an object of strings")
    out = {}
    for name, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"
        elif isinstance(item, (int, float)):
            item = str(item)
        if not isinstance(item, str):
            raise EntryProblem(f"'{key}' must be an object of strings ({name!r} is not)")
        out[name] = item
    return out


def _expand(value: str, secrets: frozenset[str], what: str) -> str:
    """``value`` with ``${env:NAME}`` / ``${NAME}`` taken from the environment."""
    for name in _variables(value):
        if name in secrets:
            raise EntryProblem(f"{what} asks for ${{{name}}}, which holds a localchat secret "
                               "and is never given to a tool server")
        if name not in os.environ:
            raise EntryProblem(f"{what} asks for ${{{name}}}, which is not set")
    return _VARIABLE.sub(lambda m: os.environ[m.group(1)], value)


def _variables(value: str) -> Iterator[str]:
    return (m.group(1) for m in _VARIABLE.finditer(value))


def _cwd(entry: dict[str, Any], folder: Path) -> str | None:
    cwd = _string(entry, "cwd")
    if not cwd:
        return None
    path = Path(cwd).expanduser()
    if not path.is_absolute():
        path = folder / path
    if not path.is_dir():
        raise EntryProblem(f"'cwd' {visible(str(path), newlines=False)} is not a folder")
    return str(path)


def _check_program(command: str, env: dict[str, str], cwd: str) -> None:
    """A missing program is found now, with a message that says so, rather than at start."""
    program = os.path.expanduser(command)
    if os.sep in program or (os.altsep and os.altsep in program):
        full = Path(cwd, program) if not os.path.isabs(program) else Path(program)
        if not (full.is_file() and os.access(full, os.X_OK)):
            raise EntryProblem(f"the program {visible(str(full), newlines=False)} does not exist "
                               "or is not executable")
        return
    search = env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=search) is None:
        raise EntryProblem(f"the program '{visible(program, newlines=False)}' was not found on "
                           "PATH")
