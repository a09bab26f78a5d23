"""ReplySteps: a reply's tokens, sampled one at a time, with drafted tokens checked in one decode.

Plain decoding evaluates the last sampled token and samples the next one from its logits. With a
draft d1..dk, the last sampled token t and the draft are evaluated together, with logits at each
of those positions only (never ``logits_all``), and the turn's sampler draws from them in order:
the token after t, and while that equals the drafted one, the token after it, and so on. So
every token kept is what one-by-one decoding would have sampled, with the same repeat-penalty
window and the same random draws (once per position, in order): the reply is the same as
without speculation, greedy or seeded. A sampled token that differs from the draft is kept (its
cell is not there yet, as for any sampled token), and the cells of the drafted tokens after it
are removed at once, so the cache holds exactly the reply's evaluated tokens.

The caller (``ConversationCache.generate``) asks for each next token; a drafted token that was
right costs no decode at all, it is already evaluated. The stop flag is checked between tokens
as before, so a stop takes effect within one check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

import numpy as np

from localchat.engine.ngram import TokenLog
from localchat.engine.runtime import BatchPart, LlamaRuntime
from localchat.engine.sampling.sampler import Sampler
from localchat.engine.speculate import TurnDrafts
from localchat.errors import EngineError


class ReplySteps:
    """The sampled tokens of one reply; ``position`` is where the next one to be kept goes."""

    def __init__(self, runtime: LlamaRuntime, sampler: Sampler, position: int,
                 drafts: TurnDrafts | None, history: Callable[[], list[int]],
                 should_stop: Callable[[], bool]) -> None:
        self.runtime = runtime
        self.sampler = sampler
        self.position = position
        self._drafts = drafts
        self._history = history  # the tokens before the reply, read at the first draft
        self._should_stop = should_stop
        self._log: TokenLog | None = None
        self._batch: list[int] = []  # the last decode's tokens, from position _start on
        self._start = position
        self._index = -1  # the output the latest token was sampled from (-1: the prefill's last)

    def first(self) -> int:
        """The reply's first token, from the prefill's logits."""
        return self.sampler.sample(-1)

    def logits(self) -> np.ndarray:
        """The logits the latest token was sampled from (with the repeat penalty applied)."""
        return self.runtime.logits_at(self._index)

    def advance(self, token: int, room: int) -> Generator[BatchPart, None, int]:
        """``token``, the latest sampled, joins the cache at ``position``; returns the token
        sampled after it, yielding the decode that needs, if any (``LlamaRuntime.drive`` runs
        it). ``room``: how many tokens may be drafted after it (the reply's and the context's
        limits)."""
        nxt = self._index + 1
        if nxt < len(self._batch) and self._batch[nxt] == token:
            self._index = nxt  # drafted and right: already evaluated
            assert self._drafts is not None
            self._drafts.accepted()
            self._note(token)
        else:
            self._leave_batch()
            self._note(token)
            draft: list[int] = []
            if self._drafts is not None and self._log is not None:
                draft = self._drafts.propose(self._log, min(room, self.runtime.n_batch - 1),
                                             self._should_stop)
            yield from self._decode([token, *draft])
        self.position += 1
        return self.sampler.sample(self._index)

    def close(self, last: int | None) -> None:
        """The reply ended with ``last`` sampled (never evaluated): drop every cell after the
        kept ones, the drafted tokens a stop or the length limit left unchecked among them."""
        nxt = self._index + 1
        if self._drafts is not None and nxt < len(self._batch) and self._batch[nxt] == last:
            self._drafts.accepted()
        self._drop_unchecked()

    def _note(self, token: int) -> None:
        """Add ``token`` to the log the drafters read (made at the first draft, not before
        the first token: the time to first token stays what it was)."""
        if self._drafts is None:
            return
        if self._log is None:
            self._log = TokenLog(self._history())
        self._log.append(token)

    def _decode(self, batch: list[int]) -> Generator[BatchPart, None, None]:
        started = time.perf_counter()
        yield BatchPart(self.runtime.seq, batch, self.position, len(batch))
        ms = (time.perf_counter() - started) * 1000.0
        if len(batch) == 1:  # the governor compares single-token decodes only
            self.runtime.governor.observe(ms)
        if self._drafts is not None:
            self._drafts.decoded(len(batch), ms)
        self._batch, self._start, self._index = batch, self.position, 0

    def _leave_batch(self) -> None:
        """The last check is over (a miss, or all of it accepted): learn from it, drop the
        cells of the drafted tokens that were not kept."""
        if len(self._batch) > 1 and self._drafts is not None:
            self._drafts.checked(len(self._batch) - 1, self._index)
        self._drop_unchecked()

    def _drop_unchecked(self) -> None:
        unchecked = self._start + len(self._batch) > self.position
        if unchecked and not self.runtime.remove(self.position, -1):
            raise EngineError("the model's memory could not drop the rejected drafts")
        self._batch, self._start = [], self.position
