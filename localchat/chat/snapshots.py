"""Reopen a stored session ready to answer: save its KV cache after each turn, restore it when
the session is opened again (from RAM when it was used recently, else from disk), and rebuild
by prefilling when there is nothing usable (with a notice, never a failure)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from localchat.context.chat_context import ChatContext
from localchat.engine.snapshot_file import KVSnapshot, SnapshotStore, SnapshotUnusable
from localchat.errors import EngineError


class SnapshotEngine(Protocol):
    """What saving and restoring a session's KV cache needs from the engine."""

    def fingerprint(self) -> dict[str, Any]:
        """What a saved state depends on (model, context size, template...): a snapshot taken
        under another fingerprint is not restored."""
        ...

    def export_snapshot(self) -> KVSnapshot: ...

    def import_snapshot(self, snapshot: KVSnapshot) -> float:
        """Restore ``snapshot``; the ms it took. Raises ``EngineError`` (the cache is then
        empty) for data the engine refuses."""
        ...

    def reset(self) -> None:
        """Empty the KV cache."""
        ...


@dataclass
class Restored:
    restore_ms: float | None  # None: nothing was restored (a rebuild by prefill follows)
    notice: str | None = None  # why a saved context was not used, for the user


class SessionSnapshots:
    """Per-session KV snapshots: a few recent ones in RAM (instant switching), all on disk."""

    def __init__(self, store: SnapshotStore, ram_entries: int = 3) -> None:
        self.store = store
        self.ram_entries = ram_entries
        self._ram: OrderedDict[str, tuple[dict, KVSnapshot, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._writers: list[threading.Thread] = []

    @classmethod
    def on_disk(cls, directory: Path, cap_bytes: int) -> SessionSnapshots:
        """Snapshots kept as files in ``directory``, least recently used dropped beyond
        ``cap_bytes``."""
        return cls(SnapshotStore(directory, cap_bytes))

    @staticmethod
    def key(session_id: int) -> str:
        return f"session-{session_id}"

    def save(self, session_id: int, engine: SnapshotEngine, chat: ChatContext, wait: bool = False) -> None:
        """Snapshot the engine's cache for this session. The copy out of llama.cpp is quick and
        runs on the engine thread; the disk write happens on a thread of its own."""
        key = self.key(session_id)
        snapshot = engine.export_snapshot()
        fingerprint = engine.fingerprint()
        meta = context_window(chat)
        with self._lock:
            self._ram[key] = (fingerprint, snapshot, meta)
            self._ram.move_to_end(key)
            while len(self._ram) > self.ram_entries:
                self._ram.popitem(last=False)
        writer = threading.Thread(target=self.store.save, args=(key, fingerprint, snapshot, meta),
                                  name="localchat-snapshot", daemon=True)
        writer.start()
        self._writers = [w for w in self._writers if w.is_alive()] + [writer]
        if wait:
            self.flush()

    def flush(self) -> None:
        """Wait for snapshot writes in progress (before the process exits)."""
        for writer in self._writers:
            writer.join()
        self._writers = []

    def restore(self, session_id: int, engine: SnapshotEngine, chat: ChatContext) -> Restored:
        """Load this session's snapshot into the engine and the chat's context window."""
        key = self.key(session_id)
        fingerprint = engine.fingerprint()
        with self._lock:
            cached = self._ram.get(key)
        try:
            if cached is not None and cached[0] == fingerprint:
                snapshot, meta = cached[1], cached[2]
            else:
                saved = self.store.load(key, fingerprint)
                if saved is None:
                    engine.reset()
                    return Restored(None)
                snapshot, meta = saved.snapshot, saved.meta
            elapsed = engine.import_snapshot(snapshot)
        except (SnapshotUnusable, EngineError) as exc:
            self.store.discard(key)
            engine.reset()
            return Restored(None, f"{exc}; rebuilding the context from the conversation")
        apply_context_window(chat, meta)
        chat.pending_restore_ms = elapsed
        return Restored(elapsed)

    def forget(self, session_id: int) -> None:
        key = self.key(session_id)
        with self._lock:
            self._ram.pop(key, None)
        self.store.discard(key)


def context_window(chat: ChatContext) -> dict[str, Any]:
    """What the model was shown of the conversation (restored with the KV cache)."""
    keeper = chat.keeper
    return {
        "history_len": len(chat.history),
        "first_visible": chat.first_visible,
        "summary": chat.summary,
        "summary_in_context": chat.summary_in_context,
        "summary_through": keeper.summary_through if keeper else -1,
        "summary_text_tokens": keeper.summary_text_tokens if keeper else 0,
    }


def apply_context_window(chat: ChatContext, meta: dict[str, Any]) -> None:
    if not meta or meta.get("history_len", 0) > len(chat.history):
        return  # saved for a longer conversation than the store has: let the policy decide
    chat.first_visible = min(int(meta.get("first_visible", 0)), len(chat.history))
    chat.summary = meta.get("summary", "")
    chat.summary_in_context = bool(meta.get("summary_in_context", True))
    if chat.keeper is not None:
        chat.keeper.summary_through = int(meta.get("summary_through", -1))
        chat.keeper.summary_text_tokens = int(meta.get("summary_text_tokens", 0))
