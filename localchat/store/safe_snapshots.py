"""A SnapshotStore whose disk faults never reach the user as a traceback.

Snapshots are a cache: a save that fails (a full disk, a folder where the file should be) keeps
the previous file (writes are atomic), is tried again after the next turn, and is reported once
per run of failures as a notice (``take_notice``) instead of a thread traceback after every reply.
"""

from __future__ import annotations

import threading
from pathlib import Path

from localchat.engine.kv import KVSnapshot
from localchat.store.snapshots import SnapshotStore


class SafeSnapshotStore(SnapshotStore):
    def __init__(self, directory: Path, cap_bytes: int | None = None) -> None:
        if cap_bytes is None:
            super().__init__(directory)
        else:
            super().__init__(directory, cap_bytes)
        self._lock = threading.Lock()
        self._failing = False
        self._notice: str | None = None

    def save(self, key: str, fingerprint: dict, snapshot: KVSnapshot, meta: dict | None = None) -> Path | None:
        """Like SnapshotStore.save; on an OSError returns None and keeps the old snapshot."""
        try:
            path = super().save(key, fingerprint, snapshot, meta)
        except OSError as exc:
            with self._lock:
                if not self._failing:  # one notice per run of failures
                    self._notice = (f"could not save this session's context ({_cause(exc)}); "
                                    "the previous one is kept and saving is retried after the "
                                    "next reply")
                self._failing = True
            return None
        with self._lock:
            self._failing = False
        return path

    def discard(self, key: str) -> None:
        try:
            super().discard(key)
        except OSError:
            pass  # e.g. a folder in its place: it is not restored either (load refuses it)

    def evict(self, keep: Path | None = None) -> list[Path]:
        try:
            return super().evict(keep)
        except OSError:
            return []  # a stray folder or a file removed meanwhile: eviction is best effort

    def take_notice(self) -> str | None:
        """The failure to report, once (None when there is nothing new)."""
        with self._lock:
            notice, self._notice = self._notice, None
        return notice


def _cause(exc: OSError) -> str:
    if exc.errno == 28:
        return "disk full"
    return exc.strerror or type(exc).__name__
