"""Files a user names: attachments (``ask -f``, ``/file``, ``@path``), ``--schema FILE``,
``--grammar FILE`` and ``/format FILE`` are read by one rule.

- A regular file or a pipe (a named pipe, or the ``/dev/fd/N`` of bash's ``<(command)``) is read,
  :data:`MAX_BYTES` at most: one byte more refuses it, so a producer that never ends (``yes``,
  ``/dev/zero`` behind a pipe) is never read for ever.
- A directory, a device (``/dev/zero``, a disk) or a socket is refused, naming what it is.
- What cannot be read says why (no such file, no permission).

:func:`read_user_file` raises :class:`UnreadableFile`, whose ``reason`` each caller puts in its
own words ("No file x.", "cannot read the grammar x: ...").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from localchat.errors import UserError

# Read at most this much before deciding: a bigger file cannot fit any context we run. A prompt
# piped on stdin has the same cap (``read_capped``).
MAX_BYTES = 4 * 1024 * 1024


class UnreadableFile(UserError):
    """A file a user named that is not read: ``reason`` says why ("is a directory", ...);
    ``missing`` when nothing has that name."""

    def __init__(self, path: Path, reason: str, missing: bool = False) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason
        self.missing = missing


def read_user_file(path: Path, advice: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the file or pipe at ``path`` (see the module); ``advice`` ends the refusal
    of one over the cap ("attach a smaller text file"); ``limit``: another cap (an image's)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UnreadableFile(path, "does not exist", missing=True) from None
    except OSError as exc:
        raise UnreadableFile(path, f"cannot be read: {exc.strerror or exc}") from None
    kind = _not_readable_kind(mode)
    if kind is not None:
        raise UnreadableFile(path, f"is {kind}, not a file")
    try:
        with open(path, "rb") as handle:
            return read_capped(handle, path.name, advice, limit)
    except OSError as exc:
        raise UnreadableFile(path, f"cannot be read: {exc.strerror or exc}") from None


def _not_readable_kind(mode: int) -> str | None:
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_capped(stream: BinaryIO, name: str, advice: str, limit: int = MAX_BYTES) -> bytes:
    """All of ``stream`` if it holds at most ``limit`` bytes, never reading more than one byte
    past them (a producer that never stops is not read for ever); UserError beyond that."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise UserError(f"{name} is over {limit // 1024 // 1024} MB; {advice}.")
    return data
