"""llama.cpp's log, kept away from the terminal: one hook for the whole process.

llama.cpp writes its log lines (and, for some errors, plain stderr) where they would tear through
the TUI and ``ask``'s output. :func:`silence` installs the hook that keeps them (the last 64
lines, for a failed load's cause, :func:`load_failure`) and notes what a load allocated
(:func:`buffer_mib`); :func:`llama_messages` catches what llama.cpp says while a block runs (its
grammar parser's refusals), :func:`quiet_stderr` drops its load chatter on fd 2.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Module-level: llama.cpp keeps the pointer, ctypes must keep the object.
_log_callback: ctypes._CFunctionType | None = None
# The last log lines, hidden from the terminal but kept: a failed load names its cause only there
# ("unknown model architecture: 'x'"), while the exception says "Failed to load model from file".
_recent_log: collections.deque[bytes] = collections.deque(maxlen=64)


# What llama.cpp allocated while loading, from its log ("CUDA0 KV buffer size = 512.00 MiB"):
# kind (model, KV, compute, output) -> device buffer name -> MiB. Cleared at each load.
_buffers: dict[str, dict[str, float]] = {}
_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size\s*=\s*([\d.]+) MiB")


def _note_buffer(line: str) -> None:
    match = _BUFFER_LINE.search(line)
    if match:
        device, kind, mib = match.group(1), match.group(2).lower(), float(match.group(3))
        per_device = _buffers.setdefault(kind, {})
        per_device[device] = per_device.get(device, 0.0) + mib


def silence() -> None:
    """Route llama.cpp's log lines away from the terminal (they would tear through the TUI and
    ``ask`` output; llama-cpp-python's own filter maps the newer log levels wrongly and lets
    warnings through). Set LOCALCHAT_LLAMA_LOG=1 to see them on stderr."""
    import llama_cpp

    global _log_callback
    if _log_callback is not None:
        return
    show = os.environ.get("LOCALCHAT_LLAMA_LOG") == "1"

    def forward(level: int, text: bytes, user_data) -> None:
        _recent_log.append(text)
        if b"buffer size" in text:
            _note_buffer(text.decode("utf-8", errors="replace"))
        if show:
            os.write(2, text)

    _log_callback = llama_cpp.llama_log_callback(forward)
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def callback() -> ctypes._CFunctionType | None:
    """The hook ``silence`` installed (libmtmd's helper log takes it too), None before."""
    return _log_callback


def start_load() -> None:
    """Forget the lines and buffers of an earlier load (a new one is about to be read)."""
    silence()
    _recent_log.clear()
    _buffers.clear()


def buffer_mib() -> dict[str, dict[str, float]]:
    """What the last load allocated, from llama.cpp's log: {"model"|"kv"|"compute"|"output":
    {device: MiB}}."""
    return {kind: dict(devices) for kind, devices in _buffers.items()}


def load_failure(model_path: Path, exc: Exception) -> str:
    """Why a model did not load, in words: the unknown architecture when llama.cpp said so."""
    import llama_cpp

    for raw in reversed(_recent_log):
        line = raw.decode("utf-8", errors="replace")
        match = re.search(r"unknown model architecture: '([^']*)'", line)
        if match:
            version = getattr(llama_cpp, "__version__", "?")
            return (f"could not load {model_path.name}: its architecture {match.group(1)!r} is not "
                    f"supported by this llama.cpp build (llama-cpp-python {version}); a newer "
                    "llama-cpp-python may support it")
    return f"could not load {model_path.name}: {exc}"


@contextlib.contextmanager
def llama_messages() -> Iterator[list[str]]:
    """What llama.cpp says while the block runs, in the list yielded once the block ends: its
    log lines and what it prints on stderr (its grammar parser writes there), so that a refusal
    can be told to the user in its own words instead of reaching the terminal."""
    silence()
    _recent_log.clear()
    said: list[str] = []
    with tempfile.TemporaryFile() as printed:
        try:
            saved = os.dup(2)
        except OSError:
            saved = -1
        if saved >= 0:
            os.dup2(printed.fileno(), 2)
        try:
            yield said
        finally:
            if saved >= 0:
                os.dup2(saved, 2)
                os.close(saved)
            printed.seek(0)
            said.extend(line.decode("utf-8", errors="replace").strip() for line in _recent_log)
            said.extend(printed.read().decode("utf-8", errors="replace").splitlines())


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """llama.cpp prints load chatter on fd 2 even with verbose=False; keep the terminal clean."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)
        os.close(devnull)
