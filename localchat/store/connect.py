"""Opening the session database file, and one-line descriptions of what went wrong with it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from localchat.errors import UserError


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


def describe(path: Path, exc: Exception) -> str:
    """One line for the user: the cause first when it is one they can act on."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    if "disk is full" in text or getattr(exc, "errno", None) == 28:
        return f"Disk full: the session database {path} could not be written."
    return f"The session database {path} could not be used: {text}."
