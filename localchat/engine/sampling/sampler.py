"""Drawing each next token of a reply from the model's logits: the repeat and OpenAI penalties,
greedy decoding or llama.cpp's temperature chain, and, for a turn with a grammar, the judge that
may draw it again (:class:`TokenJudge`, a protocol this module defines and
``engine.sampling.constrained.TurnConstraint`` implements).

Only the engine thread calls these; nothing here knows about chats, turns or grammars.
"""

from __future__ import annotations

import collections
import ctypes
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from localchat.engine.options import Sampling


class TokenJudge(Protocol):
    """Who has the last word on each token the sampler draws (a turn's grammar)."""

    # Whether the last token chosen was not the one the model drew.
    redrew_last: bool

    def choose(self, token: int, logits: np.ndarray, draw: Callable[[], int],
               pick: Callable[[np.ndarray, bool], int]) -> int:
        """The token that comes next, given the one the sampling drew from ``logits``;
        ``draw()`` draws again, ``pick(candidates, sorted)`` draws among candidates."""
        ...


# llama.cpp's repeat penalty looks at the last 64 sampled tokens (as llama_sampler_init_penalties
# is called here before: penalty_last_n 64).
PENALTY_WINDOW = 64


def apply_repeat_penalty(logits: Any, recent: Iterable[int], penalty: float,
                         frequency: float = 0.0, presence: float = 0.0) -> None:
    """llama.cpp's penalties sampler, in place: the logits of the ``recent`` tokens are divided
    by ``penalty`` (multiplied where negative), each token once however often it recurs; then
    ``frequency`` times its count in ``recent`` and ``presence`` are subtracted (OpenAI's
    frequency and presence penalties, over llama.cpp's window). ``logits``: a numpy array or
    llama.cpp's float pointer.

    A Python loop over at most PENALTY_WINDOW tokens: right after a decode (cold CPU caches)
    it takes ~10 us a token here, where numpy's gather, where and scatter took ~150 us. The
    arithmetic is llama.cpp's float32: the penalty rounded to a float32, then one double
    operation on two float32 values rounds to the same float32 as float32 arithmetic."""
    factor = float(np.float32(penalty))
    counts = collections.Counter(recent)
    for token, count in counts.items():
        value = logits[token]
        if penalty != 1.0:
            value = value * factor if value <= 0 else value / factor
        if frequency or presence:
            value -= count * frequency + presence
        logits[token] = value


class Sampler:
    """Picks each next token from the last logits, at a cost that does not grow with the
    vocabulary where that can be avoided: llama.cpp's sampler chain builds a candidate entry for
    every token of the vocabulary per call, ~0.5 ms per token for a 262,144-token vocabulary,
    and its repeat penalty looks every candidate up in a map (another ~1 ms). So the repeat
    penalty is applied here to the few recently sampled tokens' logits, and greedy decoding is an
    argmax; only sampling with temperature runs llama.cpp's chain (top-k first, in C)."""

    def __init__(self, lib, sampling: Sampling, ctx, logits: Callable[[int], np.ndarray],
                 constraint: TokenJudge | None = None,
                 row: Callable[[int], int] | None = None) -> None:
        """``logits(index)``: the logits after the last decode's ``index``-th token of this
        reply's sequence; ``row``: that token's index in the whole batch (a batch of several
        sequences, ``engine.slots``), for the calls that read llama.cpp's buffer directly."""
        self._lib = lib
        self._row = row or _same
        self._ctx = ctx
        self._logits = logits
        self._constraint = constraint
        self._penalty = sampling.repeat_penalty
        self._frequency = sampling.frequency_penalty
        self._presence = sampling.presence_penalty
        self._penalized = (self._penalty != 1.0 or self._frequency != 0.0
                           or self._presence != 0.0)
        self._recent: collections.deque[int] = collections.deque(maxlen=PENALTY_WINDOW)
        self._chain = None
        if not sampling.greedy:
            self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
            for sampler in (lib.llama_sampler_init_top_k(sampling.top_k),
                            lib.llama_sampler_init_top_p(sampling.top_p, 1),
                            lib.llama_sampler_init_min_p(sampling.min_p, 1),
                            lib.llama_sampler_init_temp(sampling.temperature)):
                lib.llama_sampler_chain_add(self._chain, sampler)
            seed = sampling.seed if sampling.seed >= 0 else lib.LLAMA_DEFAULT_SEED
            lib.llama_sampler_chain_add(self._chain, lib.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, index: int = -1) -> int:
        """The next token, from the logits after the last decode's ``index``-th token (-1: its
        last output; the repeat penalty edits them in place). A speculative check calls it once
        per position, in order, so the penalty window and the random draws are those of
        one-by-one decoding."""
        if self._penalized and self._recent:
            apply_repeat_penalty(self._logits(index), self._recent,
                                 self._penalty, self._frequency, self._presence)
        token = self._draw(index)
        if self._constraint is not None:
            token = self._constraint.choose(token, self._logits(index),
                                            lambda: self._draw(index), self._pick)
        self._recent.append(token)
        return token

    def _draw(self, index: int) -> int:
        if self._chain is None:
            return int(self._logits(index).argmax())
        return int(self._lib.llama_sampler_sample(self._chain, self._ctx, self._row(index)))

    def _pick(self, candidates: np.ndarray, by_logit: bool) -> int:
        """The token this sampling draws among ``candidates`` (a TOKEN_DATA array; ``by_logit``:
        sorted by descending logit): the best one, or the chain's draw."""
        if self._chain is None:
            return int(candidates["id"][0 if by_logit else int(candidates["logit"].argmax())])
        lib = self._lib
        array = lib.llama_token_data_array(candidates.ctypes.data_as(lib.llama_token_data_p),
                                           len(candidates), -1, by_logit)
        lib.llama_sampler_apply(self._chain, ctypes.byref(array))
        return int(array.data[array.selected].id)

    def close(self) -> None:
        if self._chain is not None:
            self._lib.llama_sampler_free(self._chain)
            self._chain = None


def _same(index: int) -> int:
    return index
