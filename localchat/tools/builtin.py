"""localchat's own tools: ``read_file``, ``list_directory`` and ``run_command``.

Each is off until ``[tools] builtins`` lists it, and every call is approved by the user like any
other (``run_command``'s "always" covers one exact command string). They go through the same
registry as MCP tools: the same argument check against their input schema, time limit,
cancellation, result cap and inert output. Paths are taken as the user would type them (``~``
expands; relative to where localchat was started). ``run_command`` runs ``/bin/sh -c COMMAND`` in
its own process group with the tool servers' allow-listed environment (no localchat secret), no
stdin, and is killed with its children when the call times out or is cancelled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localchat.settings.tools import BUILTIN_SERVER, BUILTIN_TOOLS
from localchat.tools.async_thread import in_thread
from localchat.tools.catalogue import ToolInfo
from localchat.tools.environment import child_environment
from localchat.tools.results import ToolFailure

READ_BYTES = 8 * 1024 * 1024  # of one file (the result is capped after, to the context)
OUTPUT_BYTES = 8 * 1024 * 1024  # of one command's output
MAX_ENTRIES = 1000  # of one directory listing

_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "read_file": (
        "Read a text file and return its lines (optionally a range of them).",
        {"type": "object", "properties": {
            "path": {"type": "string", "description": "The file's path."},
            "start_line": {"type": "integer", "minimum": 1,
                           "description": "The first line to return (1 is the first)."},
            "max_lines": {"type": "integer", "minimum": 1,
                          "description": "How many lines to return at most."}},
         "required": ["path"], "additionalProperties": False}),
    "list_directory": (
        "List a folder's entries: sub-folders end with '/', files show their size in bytes.",
        {"type": "object", "properties": {
            "path": {"type": "string", "description": "The folder's path (default: the current "
                                                      "folder)."}},
         "additionalProperties": False}),
    "run_command": (
        "Run a shell command and return its output (stdout and stderr) and exit status.",
        {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line, as for /bin/sh."}},
         "required": ["command"], "additionalProperties": False}),
}


def builtin_tools(enabled: tuple[str, ...]) -> tuple[ToolInfo, ...]:
    """The built-ins turned on, in their fixed order."""
    return tuple(ToolInfo(BUILTIN_SERVER, name, *_SPECS[name])
                 for name in BUILTIN_TOOLS if name in enabled)


async def run_builtin(name: str, arguments: dict[str, Any],
                      secrets: frozenset[str]) -> tuple[str, bool]:
    """(text, is_error) of one built-in call; ToolFailure for what stopped it."""
    if name == "read_file":
        return await in_thread(_read_file, arguments), False
    if name == "list_directory":
        return await in_thread(_list_directory, arguments), False
    if name == "run_command":
        return await _run_command(str(arguments["command"]), secrets)
    raise ToolFailure(f"there is no built-in tool named {name}")


def _path(arguments: dict[str, Any], default: str = "") -> Path:
    raw = str(arguments.get("path") or default)
    if not raw:
        raise ToolFailure("no path was given")
    return Path(raw).expanduser()


@contextlib.contextmanager
def _failures(verb: str, path: Path, wrong_kind: type[OSError], wrong_words: str) -> Iterator[None]:
    """The OSError of reading ``path`` as a ToolFailure the model can act on: a path that does
    not exist, one of the other kind (``wrong_kind``: ``path`` + ``wrong_words``), or another."""
    try:
        yield
    except FileNotFoundError:
        raise ToolFailure(f"{path} does not exist") from None
    except wrong_kind:
        raise ToolFailure(f"{path} {wrong_words}") from None
    except OSError as exc:
        raise ToolFailure(f"cannot {verb} {path}: {exc.strerror or exc}") from None


def _read_file(arguments: dict[str, Any]) -> str:
    path = _path(arguments)
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise ToolFailure(f"{path} is not a regular file")  # a FIFO or a device never ends
    with _failures("read", path, IsADirectoryError, "is a folder (list_directory lists folders)"), \
            path.open("rb") as f:
        data = f.read(READ_BYTES + 1)
    if b"\0" in data[:8192]:
        raise ToolFailure(f"{path} is not a text file")
    text = data[:READ_BYTES].decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    start = int(arguments.get("start_line") or 1)
    count = arguments.get("max_lines")
    chosen = lines[start - 1:start - 1 + int(count)] if count else lines[start - 1:]
    body = "".join(chosen)
    if len(data) > READ_BYTES:
        body += f"\n[... only the first {READ_BYTES:,} bytes of the file were read]"
    if not body and lines:
        return f"({path} has {len(lines)} lines; none from line {start})"
    return body or f"({path} is empty)"


def _list_directory(arguments: dict[str, Any]) -> str:
    path = _path(arguments, ".")
    with _failures("list", path, NotADirectoryError, "is a file (read_file reads files)"):
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    lines = []
    for entry in entries[:MAX_ENTRIES]:
        try:
            info = entry.stat(follow_symlinks=True)
        except OSError:
            lines.append(f"{entry.name}  (unreadable)")
            continue
        if stat.S_ISDIR(info.st_mode):
            lines.append(f"{entry.name}/")
        else:
            lines.append(f"{entry.name}  {info.st_size:,} bytes")
    if len(entries) > MAX_ENTRIES:
        lines.append(f"[... {len(entries) - MAX_ENTRIES:,} more entries not listed]")
    return "\n".join(lines) if lines else f"({path} is empty)"


async def _run_command(command: str, secrets: frozenset[str]) -> tuple[str, bool]:
    if not command.strip():
        raise ToolFailure("the command is empty")
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=child_environment(None, secrets), start_new_session=True)
    except OSError as exc:
        raise ToolFailure(f"cannot run the command: {exc.strerror or exc}") from None
    try:
        # A thread reads and reaps it: killing the group (below) ends that thread's read too.
        output, more, status = await in_thread(_output_of, process)
    except BaseException:  # a timeout or Esc cancels the task: end the command and its children
        _kill_group(process)
        raise
    text = output.decode("utf-8", errors="replace")
    if more:
        text += f"\n[... output beyond {OUTPUT_BYTES:,} bytes was dropped]"
    text = (text.rstrip("\n") + "\n" if text.strip() else "") + f"[exit status {status}]"
    return text, status != 0


def _output_of(process: subprocess.Popen[bytes]) -> tuple[bytes, bool, int]:
    """(the first OUTPUT_BYTES of the output, whether there was more, the exit status)."""
    assert process.stdout is not None
    with process.stdout:
        output = process.stdout.read(OUTPUT_BYTES + 1)
        more = len(output) > OUTPUT_BYTES
        if more:  # keep draining, or a chatty command blocks on a full pipe for ever
            while process.stdout.read(1 << 16):
                pass
    return output[:OUTPUT_BYTES], more, process.wait()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
