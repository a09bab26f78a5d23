"""ConversationCache: the conversation's cells in llama.cpp's KV cache, and the exact record of
which tokens of which message they hold. Every change to the cache goes through here, so the
record and the cache never disagree: prefill, decode, the trim shift, rollback, save, restore.

It also records how the cells were made. The first ``exact_n`` cells were computed in order from
exactly the tokens before them, so any prompt that starts with those tokens may reuse them. Cells
after a trim shift (whole turns removed, later cells moved down) still carry attention to what was
removed: they are *approximate*, and so is every cell computed after them. Approximate cells only
serve the conversation that made them (the engine decides that); they are never reused by another
session, a /retry or an edit.

Runs on the engine thread only.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from typing import Callable

from localchat.engine.layout import CachedMessage, Shift
from localchat.engine.options import Sampling
from localchat.engine.runtime import DecodeAborted, LlamaRuntime, TokenStats, token_stats
from localchat.errors import EngineError


@dataclass
class KVSnapshot:
    """A conversation's KV cache: the per-message token records and llama.cpp's sequence state."""

    records: list[CachedMessage]
    state: bytes | memoryview  # llama.cpp's sequence state, as exported or read from disk
    exact_n: int = 0  # leading cells computed in order (see ConversationCache)

    @property
    def n_tokens(self) -> int:
        return sum(len(m.tokens) for m in self.records)


class ConversationCache:
    def __init__(self, runtime: LlamaRuntime) -> None:
        self.runtime = runtime
        self.records: list[CachedMessage] = []
        self.exact_n = 0

    @property
    def n_tokens(self) -> int:
        return sum(len(m.tokens) for m in self.records)

    @property
    def approx_n(self) -> int:
        """Cells in use that a context shift made approximate."""
        return max(0, self.n_tokens - self.exact_n)

    def tokens(self) -> list[int]:
        return [t for m in self.records for t in m.tokens]

    def copy_records(self) -> list[CachedMessage]:
        return [CachedMessage(m.role, m.content, m.text, list(m.tokens), m.open) for m in self.records]

    # -- changing what is cached ---------------------------------------------------------------

    def shift(self, shift: Shift) -> list[int]:
        """Drop cells [start, end) and move the later cells down into the gap (their keys are
        re-rotated, not recomputed: from ``start`` on the cache is approximate). Returns the
        tokens now cached, in order."""
        current = self.tokens()
        self.runtime.remove(shift.start, shift.end)
        if shift.end < len(current):
            self.runtime.move(shift.end, -1, shift.delta)
        self.exact_n = min(self.exact_n, shift.start)
        return current[:shift.start] + current[shift.end:]

    def truncate(self, n_tokens: int) -> None:
        """Forget every cell from position ``n_tokens`` on (the record is set by the caller)."""
        self.runtime.remove(n_tokens, -1)
        self.exact_n = min(self.exact_n, n_tokens)

    def prefill(self, tokens: list[int], start: int, chunk: int, should_stop: Callable[[], bool],
                on_progress: Callable[[int, int], None]) -> None:
        """Evaluate prompt tokens in chunks; a stop request ends it mid-chunk (DecodeAborted)."""
        # Cells evaluated right after exact ones are exact (an aborted batch leaves no cells).
        in_order = start == self.exact_n
        for i in range(0, len(tokens), chunk):
            if should_stop():
                raise DecodeAborted
            self.runtime.decode(tokens[i:i + chunk], start + i, abortable=True)
            if in_order:
                self.exact_n = start + min(i + chunk, len(tokens))
            on_progress(min(i + chunk, len(tokens)), len(tokens))

    def generate(self, sampling: Sampling, confidence_tokens: int, should_stop: Callable[[], bool],
                 on_token: Callable[[str, int, TokenStats | None], None]) -> tuple[str, str]:
        """Sample the reply into the open record; (reply text, finish reason). A token is only
        evaluated when the next one is needed, so the last sampled token is not in the cache.
        The first ``confidence_tokens`` tokens carry their TokenStats."""
        runtime = self.runtime
        reply_record = self.records[-1]
        position = self.n_tokens
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sampled: list[bytes] = []
        evaluated_bytes = 0
        sampler = runtime.new_sampler(sampling)
        finish = "length"
        try:
            while True:
                token = sampler.sample(runtime.ctx)
                if runtime.is_end_of_generation(token):
                    finish = "stop"
                    break
                stats = (token_stats(runtime.last_logits(), token)
                         if len(sampled) < confidence_tokens else None)
                piece = runtime.piece(token)
                sampled.append(piece)
                on_token(decoder.decode(piece), token, stats)
                if len(sampled) >= sampling.max_tokens or position + 1 >= runtime.n_ctx:
                    break
                if should_stop():
                    finish = "aborted"
                    break
                started = time.perf_counter()
                try:
                    runtime.decode([token], position)
                except DecodeAborted:  # defensive: the callback is not armed while decoding
                    finish = "aborted"
                    break
                runtime.governor.observe((time.perf_counter() - started) * 1000.0)
                if self.exact_n == position:
                    self.exact_n += 1
                reply_record.tokens.append(token)
                evaluated_bytes += len(piece)
                position += 1
        finally:
            sampler.close()
        reply_bytes = b"".join(sampled)
        reply = reply_bytes.decode("utf-8", errors="replace")
        reply_record.content = reply
        reply_record.text += reply_bytes[:evaluated_bytes].decode("utf-8", errors="replace")
        return reply, finish

    def keep_whole_messages(self) -> None:
        """After a stopped prefill keep only the messages whose tokens all made it into the cache."""
        n_cached = self.runtime.max_position() + 1
        kept, total = [], 0
        for record in self.records:
            if total + len(record.tokens) > n_cached or record.open:
                break
            kept.append(record)
            total += len(record.tokens)
        self.runtime.remove(total, -1)
        self.exact_n = min(self.exact_n, total)
        self.records = kept

    def forget(self) -> None:
        """Empty the cache and its record (after a failure: start clean, never wrong)."""
        self.records = []
        self.exact_n = 0
        self.runtime.clear()

    # -- saving and restoring ------------------------------------------------------------------

    def export(self) -> KVSnapshot:
        return KVSnapshot(self.copy_records(), self.runtime.export_sequence(), self.exact_n)

    def restore(self, snapshot: KVSnapshot) -> float:
        """Load a snapshot; ms it took. EngineError (and an empty cache) if it does not fit."""
        started = time.perf_counter()
        if not self.runtime.import_sequence(snapshot.state) or self.runtime.max_position() + 1 != snapshot.n_tokens:
            self.forget()
            raise EngineError("the saved context does not match this model; it will be rebuilt")
        self.records = [CachedMessage(m.role, m.content, m.text, list(m.tokens), m.open)
                        for m in snapshot.records]
        self.exact_n = min(snapshot.exact_n, snapshot.n_tokens)
        return (time.perf_counter() - started) * 1000.0
