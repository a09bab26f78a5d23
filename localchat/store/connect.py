"""Opening the session database file, and one-line descriptions of what went wrong with it.

A reader (``sessions``, ``stats``) opens the file read-only, so that history stays readable on a
full disk or a read-only home: nothing is written, not even the WAL setup or a schema check.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from localchat.errors import UserError
from localchat.paths import broken_link


class StoreError(UserError):
    """The database file could not be read or written (locked too long, disk full, corrupt)."""


def connect(path: Path) -> sqlite3.Connection:
    """Open the database; a path that cannot hold one (a folder, a FIFO, no permission) is a
    StoreError naming it, not a sqlite3 traceback."""
    if path.exists() and not path.is_file():
        raise StoreError(f"The session database {path} is not a regular file; move it away.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: we issue BEGIN ourselves so each write is exactly one transaction.
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(describe(path, exc)) from None


def connect_read_only(path: Path) -> sqlite3.Connection:
    """Open an existing database for reading only. A WAL database whose ``-shm`` file cannot be
    created (full disk, read-only folder) and that has no ``-wal`` file (or an empty one) is
    opened as immutable: with no WAL frames there is nothing that a plain read could miss."""
    uri = path.resolve().as_uri()
    try:
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:
            db.close()
            wal = Path(f"{path}-wal")  # the failed open may have left it behind, empty
            if wal.exists() and wal.stat().st_size > 0:
                raise
        return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None,
                               check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(describe(path, exc)) from None


def describe(path: Path, exc: Exception) -> str:
    """One line for the user: the cause first when it is one they can act on.

    SQLite reports a full disk as "database or disk is full" only when a write of the database
    itself fails; creating its ``-wal``/``-shm`` files on a full disk reads "disk I/O error", so
    the folder is asked directly."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    folder = path.parent
    if "disk is full" in text or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) \
            or (isinstance(exc, sqlite3.OperationalError) and _is_full(folder)):
        return (f"Disk full: the folder {folder} has no space left, so the session database "
                "could not be written; free some space (reading history still works).")
    if isinstance(exc, sqlite3.OperationalError) and _is_read_only(folder):
        return (f"The folder {folder} is read-only, so the session database could not be "
                "written (reading history still works).")
    link = broken_link(path)  # SQLite only says "unable to open database file"
    if link:
        return f"The session database {path} {link}."
    return f"The session database {path} could not be used: {text}."


def unwritable(path: Path) -> bool:
    """True when the database at ``path`` cannot be written because its folder is full or
    read-only (then it can still be read: :func:`connect_read_only`)."""
    return _is_full(path.parent) or _is_read_only(path.parent)


def _is_full(folder: Path) -> bool:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail == 0 or (stat.f_favail == 0 and stat.f_files > 0)


def _is_read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY) or not os.access(folder, os.W_OK)
    except OSError:
        return False
