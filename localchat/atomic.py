"""Atomic file writes: write a temp file beside the target, fsync, then rename over it.

A writer holds an exclusive ``flock`` on its temp file until the rename, and the OS drops that
lock when the writer's process ends however it ends (SIGTERM, SIGKILL, a power cut's reboot).
So a temp file nobody holds is litter from a writer that died mid-write (``abandoned_temps``),
safe to delete at once, and one that is held belongs to a live write, in this process or another.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` only when the block ends without an error, so a
    crash leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _locked_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # before the close: the lock covers the file's whole life
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _locked_temp(path: Path) -> tuple[int, str]:
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits out a sweeper that is deleting it right now
        except OSError:  # no flock here (some network filesystems): sweepers cannot lock it either
            return fd, tmp
        if os.fstat(fd).st_nlink:
            return fd, tmp
        os.close(fd)  # swept between its creation and the lock: take another name


def abandoned_temps(directory: Path, pattern: str = ".*.tmp") -> Iterator[Path]:
    """Temp files under ``directory`` matching ``pattern`` whose writer is gone (no lock held).
    Each is yielded while this process holds its lock, so it can be deleted without racing a
    writer that is just starting on it (that writer then takes another name)."""
    for path in directory.glob(pattern):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile, or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a live write (or no flock here: then never swept)
            os.close(fd)
            continue
        try:
            yield path
        finally:
            os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
