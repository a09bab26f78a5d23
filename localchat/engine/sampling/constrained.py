"""A turn's constraint while its reply is sampled: how a sampled token the grammar rejects is
drawn again, at a cost that does not grow with the vocabulary (the sampler's ``TokenJudge``).

Sampling is llama.cpp's common sampler's (``common/sampling.cpp``, ``common_sampler_sample``):
the turn's own sampler draws a token as it would without a grammar (the greedy argmax, the
repeat penalty, the temperature chain), and only that token is checked against the grammar. A
rejected token is drawn again among the tokens the grammar allows, as the same sampling would
draw among them: for greedy decoding the best allowed token, for a temperature chain the chain
applied to the allowed tokens. Where llama.cpp then checks the whole vocabulary (~5 ms a token
for 49,152 tokens here, ~20 ms for 262,144), the redraw narrows first, cheapest first:

1. the ~64 tokens with the highest logits (every token above a threshold): where the grammar
   allows much (inside a string) the best allowed token is nearly always among them;
2. the tokens whose first bytes the grammar allows (``sampling.lead_bytes``): where it allows
   little (after a value: a comma, a bracket, whitespace), all of them in a few hundred
   candidates;
3. ~1,024 and ~16,384 tokens with the highest logits; then the whole vocabulary.

A window holds every token above its threshold, so when it holds an allowed token, the best one
in it is the best of all, and the chain's top-k of its allowed tokens is the top-k of all (a
chain without top-k, or a window with fewer allowed tokens than k, settles only when the tokens
outside are NEGLIGIBLE); stage 2 holds every allowed token. So each redraw picks what a pass over
the whole vocabulary would (tests/test_constrained.py checks it, on a random-weight model with a
262,144-token vocabulary too), for the cost of a few hundred candidates.

Where in the reply the grammar applies is ``formats.constraint.AnswerGate``'s to say.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from localchat.engine.sampling.grammar import TOKEN_DATA, Grammar
from localchat.engine.sampling.lead_bytes import lead_bytes
from localchat.errors import FormatError
from localchat.formats.constraint import AnswerGate, Constraint, Verdict

if TYPE_CHECKING:
    from localchat.engine.options import Sampling
    from localchat.engine.runtime import LlamaRuntime

# Candidates checked before the whole vocabulary, in order (the tokens with the highest logits).
WINDOWS = (64, 1024, 16384)
# A temperature chain may draw from a window whose allowed tokens are fewer than its top-k when
# every token outside the window is this many logits below the best allowed one: each would
# have under 1e-6 of that token's probability (e^-14), too little to move top-p's or min-p's
# cut, so the draw is the full pass's. (A structural position allows only a few tokens in the
# whole vocabulary: "," "]" and whitespace after an array item; no window holds 40 of them.)
NEGLIGIBLE = 14.0
# After the first window, the tokens whose first bytes the grammar allows (sampling.lead_bytes),
# when they are at most this many: all the tokens it may allow, so the draw is the full pass's.
NARROWED_LIMIT = 8192
# The logits sampled to estimate a window's threshold (a partition of all of them costs ~3 ms
# for 262,144 tokens; of this many, ~50 us).
THRESHOLD_SAMPLE = 4096


@dataclass
class ConstraintCounts:
    """What the constraint cost in one reply (Timings' ``constrained_n``, ``redrawn_n``,
    ``vocab_passes``)."""

    judged: int = 0  # tokens the grammar judged
    redrawn: int = 0  # of them, drawn again because the grammar rejected the first draw
    vocab_passes: int = 0  # redraws that checked the whole vocabulary


class TurnConstraint:
    """One reply's grammar, gate and redraws, for the turn's Sampler (``choose``)."""

    def __init__(self, runtime: LlamaRuntime, constraint: Constraint, inside_reasoning: bool,
                 top_k: int, greedy: bool) -> None:
        patterns = []
        for pattern in constraint.trigger_patterns:
            try:
                patterns.append(re.compile(pattern))
            except re.error as exc:
                raise FormatError(f"the trigger pattern {pattern!r} is not a regular "
                                  f"expression: {exc}") from None
        self._runtime = runtime
        self.grammar = Grammar(runtime.vocab, constraint.grammar, constraint.root)
        self.gate = AnswerGate(inside_reasoning, tuple(patterns), constraint.trigger_tokens)
        self.counts = ConstraintCounts()
        # The last token chosen was not the one the model drew: its probability under the
        # model's own distribution says nothing about how sure it is (the escalation monitor
        # is not given it).
        self.redrew_last = False
        # How many allowed tokens settle a redraw from a window: the best one, or the chain's
        # top-k (without top-k, only the NEGLIGIBLE rule settles it).
        self._needed = 1 if greedy else top_k if top_k > 0 else runtime.n_vocab + 1
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._all: np.ndarray | None = None  # the whole vocabulary's candidates, made once

    @classmethod
    def for_turn(cls, runtime: LlamaRuntime, constraint: Constraint | None, sampling: Sampling,
                 inside_reasoning: bool) -> TurnConstraint | None:
        """The turn's TurnConstraint, None without one; FormatError when llama.cpp refuses its
        grammar over this model's vocabulary."""
        if constraint is None:
            return None
        return cls(runtime, constraint, inside_reasoning, sampling.top_k, sampling.greedy)

    def choose(self, token: int, logits: np.ndarray, draw: Callable[[], int],
               pick: Callable[[np.ndarray, bool], int]) -> int:
        """The token that comes next, given the one the turn's sampling drew from ``logits``
        (a view of llama.cpp's buffer). ``draw()`` draws again from that buffer; ``pick(c,
        sorted)`` draws among candidates (a TOKEN_DATA array, by descending logit if
        ``sorted``), as the turn's sampling would."""
        runtime = self._runtime
        self.redrew_last = False
        verdict = self.gate.judge(_text(runtime.piece(token)))
        for _ in range(64):
            if verdict is not Verdict.REFUSED:
                break
            logits[token] = -np.inf  # it would start the answer unjudged
            token = draw()
            verdict = self.gate.judge(_text(runtime.piece(token)))
        else:
            verdict = Verdict.FREE  # nothing else drawn closes the block: let it through
        if verdict is Verdict.GRAMMAR:
            self.counts.judged += 1
            if not self.grammar.allows(token):
                self.counts.redrawn += 1
                self.redrew_last = True
                token = self._redraw(logits, pick)
            if not runtime.is_end_of_generation(token):
                self.grammar.accept(token)
        text = self._decoder.decode(runtime.piece(token))
        start = self.gate.advance(token, text, verdict)
        if start is not None:
            self._feed(start)
        return token

    def close(self) -> None:
        self.grammar.close()

    def _redraw(self, logits: np.ndarray, pick: Callable[[np.ndarray, bool], int]) -> int:
        """The token the turn's sampling draws among those the grammar allows."""
        for stage, size in enumerate(WINDOWS):
            if size * 2 >= len(logits):
                break
            if stage == 1:  # after the first window: the tokens the grammar may allow at all
                ids = lead_bytes(self._runtime).candidates(self.grammar, NARROWED_LIMIT)
                if ids is not None:
                    found = self._allowed(_candidates(logits, ids))
                    if len(found):
                        return pick(found, True)
            window = _candidates(logits, _top(logits, size))
            lowest = float(window["logit"].min())  # no token outside the window is higher
            allowed = self._allowed(window)
            if len(allowed) and (len(allowed) >= self._needed
                                 or lowest <= float(allowed["logit"][0]) - NEGLIGIBLE):
                return pick(allowed, True)
        self.counts.vocab_passes += 1
        if self._all is None:
            self._all = np.zeros(len(logits), dtype=TOKEN_DATA)
        candidates = self._all
        candidates["id"] = np.arange(len(logits), dtype=np.int32)  # a chain reorders them
        candidates["logit"] = logits
        self.grammar.mask(candidates)
        if not np.isfinite(candidates["logit"]).any():
            raise FormatError("the grammar allows no next token here (not even the end of the "
                              "reply): it cannot be completed")
        return pick(candidates, False)

    def _allowed(self, candidates: np.ndarray) -> np.ndarray:
        """Those of ``candidates`` the grammar allows, by descending logit."""
        self.grammar.mask(candidates)
        allowed = candidates[candidates["logit"] != -np.inf]
        return allowed[np.argsort(-allowed["logit"], kind="stable")]

    def _feed(self, text: str) -> None:
        """The grammar starts with ``text`` (what a trigger matched): its tokens are checked and
        accepted one by one."""
        tokens = self._runtime.model.tokenize(text.encode("utf-8"), False, False)
        pieces = b"".join(self._runtime.piece(t) for t in tokens)
        if pieces != text.encode("utf-8") and pieces[:1] == b" " and self._runtime.piece(tokens[0]) == b" ":
            tokens = tokens[1:]  # a tokenizer that writes a space before the first word
        for token in tokens:
            if not self.grammar.allows(token):
                # A call that does not fit (a tool not offered, a token that wrote past the
                # name): the reply goes on free, and what it wrote is read as it stands.
                self.grammar.restart()
                self.gate.give_up()
                return
            self.grammar.accept(token)


def _top(logits: np.ndarray, size: int) -> np.ndarray:
    """The ids of about ``size`` tokens: every token whose logit is at or above a threshold, so
    that no token outside has a higher one. The threshold comes from a strided sample of the
    logits; a flat distribution that puts far more tokens above it is cut to the ``size`` best."""
    stride = max(1, len(logits) // THRESHOLD_SAMPLE)
    sample = logits[::stride]
    k = min(len(sample), max(1, size // stride))
    threshold = np.partition(sample, len(sample) - k)[len(sample) - k]
    ids = np.flatnonzero(logits >= threshold)
    if len(ids) > 4 * size:
        ids = ids[np.argpartition(logits[ids], len(ids) - size)[len(ids) - size:]]
    return ids


def _candidates(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A TOKEN_DATA array of the tokens ``ids`` with their logits."""
    candidates = np.zeros(len(ids), dtype=TOKEN_DATA)
    candidates["id"] = ids
    candidates["logit"] = logits[ids]
    return candidates


def _text(piece: bytes) -> str:
    """A token's text for the gate's decisions (a split character's bytes left out: only tags
    and whitespace matter there)."""
    return piece.decode("utf-8", errors="ignore")
