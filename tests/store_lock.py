"""The store's database held by another writer, for the tests of what a failed save leaves."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def store_locked(path: Path) -> Iterator[None]:
    """Another connection holds the write lock of the SQLite file at ``path`` meanwhile."""
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
