"""Watching a local reply while it streams, to decide it should be handed to the remote.

Three signals, all from what the local engine already produces:

- **Low confidence**: ``Token.prob`` is the probability the model gave each sampled token (the
  engine computes it in a logits processor when ``EngineOptions.track_confidence`` is on; no
  ``logits_all``). After ``min_tokens`` tokens, if a low quantile of those probabilities (the
  10th percentile by default) is below ``low_prob``, the model has been guessing on a good share
  of its tokens — the typical shape of a confabulated answer.
- **Repetition loop**: the reply's text ends with one unit repeated several times.
- **Out of context**: the reply ended with ``finish_reason == "length"`` because the local
  context was full (not because of the user's ``max_tokens``, which the remote gets too).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Literal

from localchat.events import Done, Token
from localchat.remote.settings import ConfidenceThresholds

TriggerKind = Literal["low-confidence", "loop", "length"]

# Longest repeated unit looked for, in characters: a repeated sentence or a short paragraph.
_MAX_LOOP_UNIT = 240


@dataclass(frozen=True)
class Trigger:
    """Why a local reply should be escalated. ``reason`` is one line for route_reason."""

    kind: TriggerKind
    reason: str


class ConfidenceMonitor:
    """Feed it each ``Token`` of one local reply, then its ``Done``; it answers with a
    :class:`Trigger` the first time a signal fires (and None otherwise, and after that)."""

    def __init__(self, thresholds: ConfidenceThresholds | None = None) -> None:
        self.thresholds = thresholds or ConfidenceThresholds()
        self._probs: list[float] = []  # kept sorted: the quantile is one index away
        self._text: list[str] = []
        self._length = 0
        self._fired = False

    @property
    def tokens_seen(self) -> int:
        return len(self._probs)

    def low_quantile(self) -> float | None:
        """The watched quantile of token probability so far (None before any probability)."""
        if not self._probs:
            return None
        index = math.floor(self.thresholds.quantile * (len(self._probs) - 1))
        return self._probs[index]

    def observe(self, token: Token) -> Trigger | None:
        if self._fired:
            return None
        if token.prob is not None:
            bisect.insort(self._probs, token.prob)
        self._text.append(token.text)
        self._length += len(token.text)
        trigger = self._low_confidence() or self._loop()
        self._fired = trigger is not None
        return trigger

    def finished(self, done: Done) -> Trigger | None:
        """The length rule, judged on the finished local reply: only a reply that ran out of
        local context escalates. One cut by the user's own max_tokens does not: the remote
        would be cut at the same limit."""
        if self._fired or not self.thresholds.escalate_on_length or done.finish_reason != "length":
            return None
        t = done.timings
        if not (t.n_ctx and t.n_ctx_used >= t.n_ctx - 1):
            return None
        self._fired = True
        return Trigger("length", f"local reply ran out of context ({t.n_ctx} tokens, "
                                 f"{t.predicted_n} generated)")

    def _low_confidence(self) -> Trigger | None:
        t = self.thresholds
        if len(self._probs) < t.min_tokens:
            return None
        quantile = self.low_quantile()
        if quantile is None or quantile >= t.low_prob:
            return None
        return Trigger("low-confidence",
                       f"low confidence: p{round(t.quantile * 100)} token probability "
                       f"{quantile:.3f} < {t.low_prob:g} after {len(self._probs)} tokens")

    def _loop(self) -> Trigger | None:
        t = self.thresholds
        if not t.escalate_on_loop or self._length < t.loop_min_chars:
            return None
        text = "".join(self._text)[-(_MAX_LOOP_UNIT * t.loop_min_repeats + t.loop_min_chars):]
        self._text = [text]  # only the tail can ever matter
        found = find_loop(text, t.loop_min_chars, t.loop_min_repeats)
        if found is None:
            return None
        unit, repeats = found
        return Trigger("loop", f"repetition loop: {unit!r:.40} repeated {repeats} times")


def find_loop(text: str, min_chars: int, min_repeats: int) -> tuple[str, int] | None:
    """The unit and count when ``text`` ends with one unit repeated ``min_repeats`` or more times
    over at least ``min_chars`` characters; None otherwise. Whitespace-only units don't count."""
    for size in range(1, min(_MAX_LOOP_UNIT, len(text) // min_repeats) + 1):
        unit = text[-size:]
        # Cheap test first: most sizes fail at the second copy.
        if text[-2 * size:-size] != unit or not unit.strip():
            continue
        needed = max(min_repeats, math.ceil(min_chars / size))
        if needed * size > len(text) or text[-needed * size:] != unit * needed:
            continue
        repeats = needed
        while (repeats + 1) * size <= len(text) and text[-(repeats + 1) * size:-repeats * size] == unit:
            repeats += 1
        return unit, repeats
    return None
