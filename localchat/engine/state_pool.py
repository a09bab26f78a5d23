"""Saved conversation states in RAM, for a front end that answers several conversations from one
context (``localchat serve``: every client re-sends its whole history, and conversations take
turns).

Before a turn the engine asks the pool (``StatePool.swap``) which state keeps the most of the
turn's messages: the live context, or one saved here. It restores the better one and prefills
only the rest; the live context is saved here first whenever the turn would drop some of it.

The rules are llama-server's prompt cache (``server_prompt_cache``: ``alloc`` and ``load`` in
tools/server/server-task.cpp), over the engine's per-message records instead of raw tokens:

- a saved state is taken only if it keeps more of the new messages than the live context does,
  and a larger share of itself (``f_keep``); never one that would keep under a quarter of itself
  (restoring a long state to use a sliver of it trashes it for its own conversation);
- a state restored leaves the pool (it is live now; it comes back when it is displaced);
- saving skips a state already held whole by an entry, and removes the entries it holds whole;
- least recently saved states go first beyond the byte cap;
- a prompt given as tokens that keeps at least half of the live state edits it (the next
  keystroke of a completion, which drops the last reply and the text after the cursor): the
  live state is not saved for it, or a few typed lines would crowd every conversation out.

"Keeps" is read from the records: the leading cached messages equal to the request's messages
(role and content) whose text is the request's prompt at their place (``layout.ChatPrompt``: the
same message rendered with tools, or under another system prompt, is other tokens), or for a
prompt given as tokens (``layout.RawPrompt``: a completion) the leading cached tokens equal to its
own; at most ``exact_n`` cells (only cells computed in order from exactly the
tokens before them are reused), and, for a memory that cannot drop cells (recurrent, sliding
window), only as far back as a checkpoint unless the whole state is kept. It is an estimate that
is never wrong about exactness: the turn's own layout then decides which cells it reuses.

Plain logic over records and snapshots: tested without a model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localchat.engine.layout import CachedMessage, ChatPrompt, RawPrompt
from localchat.engine.snapshot_file import KVSnapshot

# llama-server's "don't trash large prompts": a saved state must keep this share of itself.
MIN_KEEP = 0.25
# A prompt given as tokens that keeps this share of the live state goes on with it (see above).
EDIT_KEEP = 0.5

Wanted = ChatPrompt | RawPrompt  # a chat turn's messages and prompt, or a prompt given as tokens


@dataclass(frozen=True)
class StateView:
    """What a state holds, as the pool weighs it: its records, its exact cells, and where it
    can roll back to (None: any cell can be dropped)."""

    records: Sequence[CachedMessage]
    exact_n: int
    checkpoints: Sequence[int] | None = None

    @property
    def n_tokens(self) -> int:
        return sum(len(m.tokens) for m in self.records)

    def kept(self, wanted: Wanted) -> int:
        """Cells of this state that a turn for ``wanted`` would keep (see the module doc)."""
        kept = 0
        if isinstance(wanted, RawPrompt):
            held = [t for m in self.records for t in m.tokens]
            while kept < min(len(held), len(wanted.tokens)) and held[kept] == wanted.tokens[kept]:
                kept += 1
        else:
            at = 0  # where the next record's text must be in the prompt
            for record, message in zip(self.records, wanted.messages):
                if not record.matches(message) or not wanted.text.startswith(record.text, at):
                    break
                kept += len(record.tokens)
                at += len(record.text)
        kept = min(kept, self.exact_n)
        if self.checkpoints is not None and kept < self.n_tokens:
            kept = max((n for n in self.checkpoints if n <= kept), default=0)
        return kept

    @classmethod
    def of(cls, snapshot: KVSnapshot, rolls_back: bool) -> StateView:
        return cls(snapshot.records, snapshot.exact_n,
                   [n for n, _ in snapshot.checkpoints] if rolls_back else None)


class StatePool:
    """Saved states, least recently saved first, under ``cap_bytes`` in all."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        # Parallel slots (``engine.slots``) start turns on threads of their own.
        self._lock = threading.RLock()
        self._entries: list[KVSnapshot] = []
        self.restored = 0  # states taken back into the live context (for the server's log)
        self.saved = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"StatePool({len(self)} states, {self.size_bytes} of {self.cap_bytes} bytes)"

    @property
    def size_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries = []

    def swap(self, live: StateView, wanted: Wanted, rolls_back: bool,
             export_live: Callable[[], KVSnapshot]) -> KVSnapshot | None:
        """Before a turn for ``wanted``: the saved state to restore instead of the live one
        (taken out of the pool), or None to keep the live one. The live state is saved first
        (``export_live``) whenever the turn would drop some of it, restored or not."""
        with self._lock:
            return self._swap(live, wanted, rolls_back, export_live)

    def _swap(self, live: StateView, wanted: Wanted, rolls_back: bool,
              export_live: Callable[[], KVSnapshot]) -> KVSnapshot | None:
        live_kept = live.kept(wanted)
        best = self._best(live, live_kept, wanted, rolls_back)
        if best is not None:
            # Out before the live state is saved: saving may evict the oldest entries, the one
            # to restore among them (a ValueError from ``remove`` once, a 500 in serve).
            self._entries.remove(best)
            self.restored += 1
        edits_live = isinstance(wanted, RawPrompt) and live_kept >= EDIT_KEEP * live.n_tokens
        if self.cap_bytes > 0 and live_kept < live.n_tokens and not edits_live:
            self.save(export_live())
        return best

    def _best(self, live: StateView, live_kept: int, wanted: Wanted,
              rolls_back: bool) -> KVSnapshot | None:
        best_keep = live_kept / live.n_tokens if live.n_tokens else -1.0  # empty: any state wins
        best_kept = live_kept
        best = None
        for entry in self._entries:
            view = StateView.of(entry, rolls_back)
            kept = view.kept(wanted)
            keep = kept / max(1, view.n_tokens)
            if keep < MIN_KEEP:
                continue
            if keep > best_keep and kept > best_kept:
                best, best_keep, best_kept = entry, keep, kept
        return best

    def save(self, snapshot: KVSnapshot) -> bool:
        """Keep ``snapshot``, unless an entry already holds all of it or it is larger than the
        cap; entries it holds whole go, then the oldest until all fit. Whether it was kept."""
        with self._lock:
            return self._save(snapshot)

    def _save(self, snapshot: KVSnapshot) -> bool:
        tokens = _tokens(snapshot)
        if not tokens or snapshot.size_bytes > self.cap_bytes:
            return False
        for entry in self._entries:
            if _tokens(entry)[:len(tokens)] == tokens:
                return False
        self._entries = [e for e in self._entries if tokens[:len(_tokens(e))] != _tokens(e)]
        while self._entries and self.size_bytes + snapshot.size_bytes > self.cap_bytes:
            self._entries.pop(0)
        self._entries.append(snapshot)
        self.saved += 1
        return True


def _tokens(snapshot: KVSnapshot) -> list[int]:
    return [t for m in snapshot.records for t in m.tokens]
