"""Per-session locks shared by every localchat process on this machine.

Two ``ask --session same`` runs at once would otherwise both read the history, both answer, and
store U1, U2, A1, A2, with A2 generated without seeing A1. The lock is held from reading a
session's history to storing its reply, so the second run waits and then continues the first's
conversation. An advisory file lock (flock): the OS releases it if the holder dies.
"""

from __future__ import annotations

from collections.abc import Callable

from filelock import FileLock, Timeout

from localchat import paths


class SessionLock:
    def __init__(self, session_id: int) -> None:
        folder = paths._ensure(paths.data_dir() / "locks")
        self.path = folder / f"session-{session_id}.lock"
        # thread_local=False: a turn may be started on one thread and finished on another (app).
        self._lock = FileLock(self.path, thread_local=False, is_singleton=False)

    def acquire(self, on_wait: Callable[[], None] | None = None) -> None:
        """Take the lock, blocking while another process holds it; ``on_wait`` is called once
        before waiting so the user knows why nothing happens."""
        if self.try_acquire():
            return
        if on_wait is not None:
            on_wait()
        self._lock.acquire()

    def try_acquire(self) -> bool:
        """Take the lock if no one holds it; False (without waiting) if another process does."""
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()

    def __repr__(self) -> str:
        return f"<SessionLock {self.path.name} {'held' if self._lock.is_locked else 'free'}>"
