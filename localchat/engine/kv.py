"""ConversationCache: the conversation's cells in llama.cpp's KV cache, and the exact record of
which tokens of which message they hold. Every change to the cache goes through here, so the
record and the cache never disagree: prefill, decode, the trim shift, rollback, save, restore.

It also records how the cells were made. The first ``exact_n`` cells were computed in order from
exactly the tokens before them, so any prompt that starts with those tokens may reuse them. Cells
after a trim shift (whole turns removed, later cells moved down) still carry attention to what was
removed: they are *approximate*, and so is every cell computed after them. Approximate cells only
serve the conversation that made them (the engine decides that); they are never reused by another
session, a /retry or an edit.

Some memories cannot drop cells: a recurrent state (Mamba, the recurrent layers of a hybrid such
as LFM2 or Qwen3.5) folds every token into one state, and a sliding-window cache that keeps only
the window has already dropped what an earlier position would need. For those the cache keeps a
few checkpoints (the state that cannot be rolled back, at a known number of tokens) and a
rollback restores the nearest one at or before the point wanted; the caller prefills the rest.

Every change runs on the engine thread. Other threads (the session measuring its context before a
turn, while a background job may be rewriting the record) read it only through ``copy_records``
and ``n_tokens``, which take the record's lock: they see it before or after a change, never
halfway.
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Protocol

from localchat.engine.image_records import image_run, next_image
from localchat.engine.layout import CachedMessage, Shift, without_partial
from localchat.engine.options import Sampling
from localchat.engine.runtime import BatchPart, DecodeAborted, LlamaRuntime
from localchat.engine.sampling.confidence import TokenStats, token_stats
from localchat.engine.sampling.logprobs import token_logprob
from localchat.engine.sampling.sampler import TokenJudge
from localchat.engine.snapshot_file import KVSnapshot
from localchat.engine.speculate import TurnDrafts
from localchat.engine.state_pool import StatePool, StateView, Wanted
from localchat.engine.verify import ReplySteps
from localchat.errors import EngineError
from localchat.events import FinishReason, TokenLogprob

log = logging.getLogger(__name__)


class ImageEvaluator(Protocol):
    images_n: int  # pictures encoded so far this turn
    image_ms: float  # and the time that took

    def evaluate(self, first_token: int, n_tokens: int, position: int,
                 runtime: LlamaRuntime) -> None:
        """Evaluate the image whose ``n_tokens`` placeholders start with ``first_token`` at
        ``position``.. of ``runtime``'s sequence."""


@dataclass
class Checkpoint:
    """The part of the state that removal cannot roll back, when ``n_tokens`` cells were held."""

    n_tokens: int
    data: bytes


@dataclass(frozen=True)
class Mark:
    """What the cache held at one moment (``ConversationCache.mark``), to come back to."""

    records: list[CachedMessage]
    n_tokens: int


class ConversationCache:
    def __init__(self, runtime: LlamaRuntime, max_checkpoints: int = 8) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()  # the record, for readers on other threads
        self._records: list[CachedMessage] = []
        self.exact_n = 0
        self.uses_checkpoints = runtime.needs_checkpoints and max_checkpoints > 0
        self.max_checkpoints = max(1, max_checkpoints)
        self.checkpoints: list[Checkpoint] = []
        # How this turn's prefill evaluates the pictures in its prompt (``image_records``): set
        # by the engine for a turn with images, None otherwise.
        self.images: ImageEvaluator | None = None

    @property
    def records(self) -> list[CachedMessage]:
        """The record itself (engine thread only; other threads use ``copy_records``)."""
        return self._records

    @property
    def n_tokens(self) -> int:
        with self._lock:
            return sum(len(m.tokens) for m in self._records)

    @property
    def approx_n(self) -> int:
        """Cells in use that a context shift made approximate."""
        return max(0, self.n_tokens - self.exact_n)

    def tokens(self) -> list[int]:
        return [t for m in self.records for t in m.tokens]

    def copy_records(self) -> list[CachedMessage]:
        """A copy of the record, consistent even while the engine thread changes it."""
        with self._lock:
            return [replace(m, tokens=list(m.tokens)) for m in self._records]

    def _set_records(self, records: list[CachedMessage]) -> None:
        with self._lock:
            self._records = records

    # -- changing the record around a fill (the engine's turns and background jobs) ------------

    def mark(self) -> Mark:
        """The record now, to ``put_back`` after a job that only appends."""
        with self._lock:
            return Mark(self._records, sum(len(m.tokens) for m in self._records))

    def put_back(self, mark: Mark) -> None:
        """Return to ``mark``: its record, and no cells beyond its whole messages."""
        self._set_records(mark.records)
        self.truncate(mark.n_tokens, whole_messages=True)

    def hold(self, messages: list[CachedMessage]) -> None:
        """Take ``messages`` as the record before the fill that brings the cells up to them
        (``prefill``, then ``generate`` into the last, open one). The cells they share with the
        cache must already be in place (``shift``, ``truncate``)."""
        self._set_records(messages)

    # -- changing what is cached ---------------------------------------------------------------

    def shift(self, shift: Shift) -> list[int]:
        """Drop cells [start, end) and move the later cells down into the gap (their keys are
        re-rotated, not recomputed: from ``start`` on the cache is approximate). Returns the
        tokens now cached, in order."""
        current = self.tokens()
        if not self.runtime.remove(shift.start, shift.end):
            raise EngineError("this model's memory cannot drop turns in place")
        if shift.end < len(current):
            self.runtime.move(shift.end, -1, shift.delta)
        self.exact_n = min(self.exact_n, shift.start)
        return current[:shift.start] + current[shift.end:]

    def truncate(self, n_tokens: int, *, whole_messages: bool = False, dirty: bool = False) -> int:
        """Forget every cell from position ``n_tokens`` on; returns how many cells are kept.
        That is ``n_tokens`` (or fewer if fewer are held) unless the memory cannot drop cells:
        then the nearest checkpoint at or before it is restored (0 without one) and the caller
        prefills what is missing. ``dirty``: a stopped batch may have changed the state past
        ``n_tokens``, so roll back even if nothing seems to be there. The caller sets the record,
        except with ``whole_messages``: only checkpoints at message boundaries are used, and the
        record keeps the messages that are still whole."""
        allowed = self._boundaries() if whole_messages else None
        held = self.runtime.max_position() + 1
        if dirty:
            kept = self._roll_back(n_tokens, allowed)
        elif n_tokens >= held:
            kept = held
        elif self.runtime.remove(n_tokens, -1):
            kept = n_tokens
        else:
            kept = self._roll_back(n_tokens, allowed)
        self.checkpoints = [c for c in self.checkpoints if c.n_tokens <= kept]
        self.exact_n = min(self.exact_n, kept)
        if whole_messages:
            self._set_records(self._whole_records(kept, keep_open=True))
            total = sum(len(r.tokens) for r in self.records)
            if total < kept:  # cells of a message cut in the middle
                return self.truncate(total, whole_messages=True)
        return kept

    def checkpoint(self) -> None:
        """Save a checkpoint of the cells held now (memories that need them only). The first
        one is kept longest (it usually sits after the system prompt); others go oldest first."""
        if not self.uses_checkpoints:
            return
        n = self.runtime.max_position() + 1
        if n <= 0 or any(c.n_tokens == n for c in self.checkpoints):
            return
        self.checkpoints.append(Checkpoint(n, self.runtime.checkpoint_data()))
        if len(self.checkpoints) > self.max_checkpoints:
            del self.checkpoints[1 if self.max_checkpoints > 1 else 0]

    def _roll_back(self, n_tokens: int, allowed: set[int] | None) -> int:
        for checkpoint in reversed(self.checkpoints):
            if checkpoint.n_tokens > n_tokens or (allowed is not None and checkpoint.n_tokens not in allowed):
                continue
            if self.runtime.restore_checkpoint(checkpoint.data, checkpoint.n_tokens):
                return checkpoint.n_tokens
            break
        self.runtime.clear()
        return 0

    def _boundaries(self) -> set[int]:
        total, ends = 0, set()
        for record in self.records:
            total += len(record.tokens)
            ends.add(total)
        return ends

    def _whole_records(self, n_cells: int, keep_open: bool = False) -> list[CachedMessage]:
        """The leading records whose tokens all lie in the first ``n_cells`` cells (an open
        record, the reply header after a stopped prefill, only with ``keep_open``)."""
        kept, total = [], 0
        for record in self.records:
            if total + len(record.tokens) > n_cells or (record.open and not keep_open):
                break
            kept.append(record)
            total += len(record.tokens)
        return kept

    def prefill(self, tokens: list[int], start: int, chunk: int, should_stop: Callable[[], bool],
                on_progress: Callable[[int, int], None], checkpoint_at: int | None = None) -> None:
        """Evaluate prompt tokens in chunks; a stop request ends it mid-chunk (DecodeAborted).
        ``checkpoint_at``: save a checkpoint after that many of ``tokens`` (see ``checkpoint``)."""
        # Cells evaluated right after exact ones are exact (an aborted batch leaves no cells).
        in_order = start == self.exact_n
        done = 0
        while done < len(tokens):
            if should_stop():
                raise DecodeAborted
            image = image_run(tokens, done)
            if image:  # a picture's placeholders: evaluated whole, by the projector
                end = done + image
            else:
                end = min(done + chunk, next_image(tokens, done))
                if checkpoint_at is not None and done < checkpoint_at < end:
                    end = checkpoint_at
            try:
                if image:
                    self.evaluate_image(tokens[done], image, start + done)
                else:
                    self.runtime.decode(tokens[done:end], start + done, abortable=True)
            except DecodeAborted:
                if self.uses_checkpoints:  # a recurrent state may be half-updated: roll back
                    self.truncate(start + done, dirty=True)
                raise
            done = end
            if in_order:
                self.exact_n = start + done
            if done == checkpoint_at:
                self.checkpoint()
            on_progress(done, len(tokens))

    def evaluate_image(self, first_token: int, n_tokens: int, position: int) -> None:
        if self.images is None:
            raise EngineError("the prompt holds an image but this turn has no image projector")
        self.images.evaluate(first_token, n_tokens, position, self.runtime)

    def generate(self, sampling: Sampling, confidence_tokens: int, should_stop: Callable[[], bool],
                 on_token: Callable[[str, int, TokenStats | None, TokenLogprob | None], None],
                 drafts: TurnDrafts | None = None,
                 constraint: TokenJudge | None = None) -> tuple[str, FinishReason]:
        """Sample the reply into the open record; (reply text, finish reason). A token is only
        evaluated when the next one is needed, so the last sampled token is not in the cache.
        The first ``confidence_tokens`` tokens carry their TokenStats, and with
        ``sampling.logprobs`` every token its TokenLogprob. With ``drafts``, drafted
        tokens are checked in one decode each time (``verify``): the same reply, sooner; a
        drafted token the ``constraint`` rejects is never what the turn samples, so it ends
        the draft."""
        return self.runtime.drive(self._generation(sampling, confidence_tokens, should_stop,
                                                   on_token, drafts, constraint))

    def _generation(self, sampling: Sampling, confidence_tokens: int,
                    should_stop: Callable[[], bool],
                    on_token: Callable[[str, int, TokenStats | None, TokenLogprob | None], None],
                    drafts: TurnDrafts | None, constraint: TokenJudge | None,
                    ) -> Generator[BatchPart, None, tuple[str, FinishReason]]:
        """``generate``'s work, yielding each decode it needs (``LlamaRuntime.drive``)."""
        runtime = self.runtime
        reply_record = self.records[-1]
        position = self.n_tokens
        # One decoder makes both what is streamed and what is stored: it holds back the bytes of
        # a character not yet complete, so a reply cut inside one (max_tokens, a stop) keeps
        # exactly the text that was shown, never a U+FFFD for the missing half.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        shown: list[str] = []
        sampled: list[bytes] = []
        evaluated_bytes = 0
        sampler = runtime.new_sampler(sampling, constraint)
        steps = ReplySteps(runtime, sampler, position, drafts, self.tokens, should_stop)
        finish: FinishReason = "length"
        token: int | None = None
        try:
            token = steps.first()
            while True:
                if runtime.is_end_of_generation(token):
                    finish = "stop"
                    break
                judged = len(sampled) < confidence_tokens and not (
                    constraint is not None and constraint.redrew_last)
                stats = token_stats(steps.logits(), token) if judged else None
                logprob = None if sampling.logprobs is None else token_logprob(
                    steps.logits(), token, sampling.logprobs, runtime.piece)
                piece = runtime.piece(token)
                sampled.append(piece)
                text = decoder.decode(piece)
                shown.append(text)
                on_token(text, token, stats, logprob)
                if len(sampled) >= sampling.max_tokens or position + 1 >= runtime.n_ctx:
                    break
                if should_stop():
                    finish = "aborted"
                    break
                # Drafted tokens must fit the reply's and the context's limits as plain ones do.
                room = min(sampling.max_tokens - len(sampled), runtime.n_ctx - 1 - position) - 1
                try:
                    following = yield from steps.advance(token, room)
                except DecodeAborted:  # defensive: the callback is not armed while decoding
                    finish = "aborted"
                    break
                if self.exact_n == position:
                    self.exact_n += 1
                with self._lock:
                    reply_record.tokens.append(token)
                evaluated_bytes += len(piece)
                position += 1
                token = following
        finally:
            try:
                steps.close(token)
            finally:
                sampler.close()
        reply = "".join(shown)
        with self._lock:
            reply_record.content = reply
            # The cells' own text (a half character as U+FFFD: it cannot match a later prompt).
            reply_record.text += b"".join(sampled)[:evaluated_bytes].decode("utf-8", errors="replace")
        return reply, finish

    def keep_evaluated(self) -> None:
        """After a stopped prefill keep every cell it evaluated: the whole messages, then the
        first tokens of the one it stopped in as a partial record (exact cells, which the next
        prompt reuses as far as its tokens agree: a long draft is not lost to a keystroke)."""
        held = self.runtime.max_position() + 1
        kept, total = [], 0
        for record in self.records:
            n = len(record.tokens)
            if total + n <= held and not record.open:
                kept.append(record)
                total += n
                continue
            if held > total:
                kept.append(CachedMessage.partial_of(record, held - total))
                total = held
            break
        self._set_records(kept)
        if total < held:  # cells beyond the record (none expected): drop them
            self.truncate(total, whole_messages=True)

    def drop_partial(self) -> None:
        """Forget the cells of a partial record at the end (see ``keep_evaluated``), so that the
        cache ends with whole messages again."""
        whole = without_partial(self.records)
        if len(whole) < len(self.records):
            self.truncate(sum(len(r.tokens) for r in whole), whole_messages=True)

    def forget(self) -> None:
        """Empty the cache and its record (after a failure: start clean, never wrong)."""
        self._set_records([])
        self.exact_n = 0
        self.checkpoints = []
        self.runtime.clear()

    # -- saving and restoring ------------------------------------------------------------------

    def export(self, with_checkpoints: bool = False) -> KVSnapshot:
        """The cells and their record; ``with_checkpoints``: the rollback states too (a snapshot
        kept in RAM, restored later to serve a prefix of it)."""
        checkpoints = [(c.n_tokens, c.data) for c in self.checkpoints] if with_checkpoints else []
        return KVSnapshot(self.copy_records(), self.runtime.export_sequence(), self.exact_n,
                          checkpoints)

    def take_best_state(self, pool: StatePool, wanted: Wanted) -> float:
        """Bring the live context to the state that keeps the most of ``wanted`` (the live one,
        or one from ``pool``, see ``state_pool``); the ms a restore took (0: none)."""
        rolls_back = self.uses_checkpoints
        live = StateView(self.records, self.exact_n,
                         [c.n_tokens for c in self.checkpoints] if rolls_back else None)
        chosen = pool.swap(live, wanted, rolls_back, lambda: self.export(with_checkpoints=True))
        if chosen is None:
            return 0.0
        try:
            return self.restore(chosen)
        except EngineError:  # refused by llama.cpp: the cache is empty, the turn prefills it all
            log.warning("a saved conversation state could not be restored", exc_info=True)
            return 0.0

    def restore(self, snapshot: KVSnapshot) -> float:
        """Load a snapshot; ms it took. EngineError (and an empty cache) if it does not fit."""
        started = time.perf_counter()
        if not self.runtime.import_sequence(snapshot.state) or self.runtime.max_position() + 1 != snapshot.n_tokens:
            self.forget()
            raise EngineError("the saved context does not match this model; it will be rebuilt")
        self._set_records([replace(m, tokens=list(m.tokens)) for m in snapshot.records])
        self.checkpoints = [Checkpoint(n, data) for n, data in snapshot.checkpoints
                            if n <= snapshot.n_tokens] if self.uses_checkpoints else []
        self.checkpoint()
        self.exact_n = min(snapshot.exact_n, snapshot.n_tokens)
        return (time.perf_counter() - started) * 1000.0
