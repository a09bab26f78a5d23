"""Watching a local reply while it streams, to decide it should be handed to the remote.

The signals, all from what the local engine already produces:

- **Uncertain start**: the engine fills ``Token.entropy`` and ``Token.margin`` (top-1 minus top-2
  probability) for the reply's first ``EngineOptions.confidence_tokens`` tokens only. Over a
  window of ``min_tokens`` of them, a high mean entropy or a low mean margin means the model is
  choosing between several continuations at most steps: the shape of an answer it is making up.
  The window slides while the engine gives numbers, so this decides within the first 32 tokens
  or not at all; tokens without numbers are "no data", never a reason to wait longer.
- **Low probability**: a low quantile of ``Token.prob`` (the sampled token's probability) over
  the same tokens (``low_prob``; conservative, see settings.py).
- **Repetition loop**: the reply's text ends with one unit repeated several times.
- **Out of context**: the reply ended with ``finish_reason == "length"`` because the local
  context was full (not because of the user's ``max_tokens``, which the remote gets too).

The thresholds of the first signal scale with the local model's size (:func:`scaled`): measured on
SmolLM2-135M; a larger model is trusted further, as the router's rules do.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, replace
from statistics import fmean
from typing import Literal

from localchat.events import Done, Token
from localchat.settings.remote import ConfidenceThresholds

TriggerKind = Literal["low-confidence", "loop", "length"]

# Longest repeated unit looked for, in characters: a repeated sentence or a short paragraph.
_MAX_LOOP_UNIT = 240

# An escalation after more than this many local tokens is "late": the local work was wasted and
# the user waited for it. route_reason says so and `bench --router` counts it.
LATE_AFTER_TOKENS = 64

# The entropy and margin limits hold for a model of _REFERENCE_PARAMS (SmolLM2-135M, where they
# were calibrated); each tenfold in size moves them by _PER_DECADE of their value towards trusting
# the model (escalating less). A policy, not a measurement: only the 135M model was at hand.
_REFERENCE_PARAMS = 135e6
_PER_DECADE = 0.25


def scaled(thresholds: ConfidenceThresholds, n_params: int | None) -> ConfidenceThresholds:
    """``thresholds`` for a local model of ``n_params`` parameters (None: unknown, unchanged)."""
    if not n_params or n_params <= 0:
        return thresholds
    decades = max(0.0, math.log10(n_params / _REFERENCE_PARAMS))
    factor = 1.0 + _PER_DECADE * decades
    return replace(thresholds, max_entropy=thresholds.max_entropy * factor,
                   min_margin=thresholds.min_margin / factor)


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
        window = max(1, self.thresholds.min_tokens)
        self._entropies: deque[float] = deque(maxlen=window)
        self._margins: deque[float] = deque(maxlen=window)
        self._text: list[str] = []
        self._length = 0
        self._fired = False
        self.tokens_seen = 0  # every local token, with or without numbers

    def low_quantile(self) -> float | None:
        """The watched quantile of token probability so far (None before any probability)."""
        if not self._probs:
            return None
        index = math.floor(self.thresholds.quantile * (len(self._probs) - 1))
        return self._probs[index]

    def observe(self, token: Token) -> Trigger | None:
        if self._fired:
            return None
        self.tokens_seen += 1
        scored = token.prob is not None or token.entropy is not None or token.margin is not None
        if token.prob is not None:
            bisect.insort(self._probs, token.prob)
        if token.entropy is not None:
            self._entropies.append(token.entropy)
        if token.margin is not None:
            self._margins.append(token.margin)
        self._text.append(token.text)
        self._length += len(token.text)
        # The confidence signals are judged only when new numbers arrive: after the engine's
        # window they cannot change, and a verdict must not wait for data that never comes.
        trigger = (self._uncertain_start() or self._low_confidence() if scored else None) or self._loop()
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

    def watch(self, event: object) -> Trigger | None:
        """``observe`` a Token, ``finished`` a Done that was not stopped; None for the rest."""
        if isinstance(event, Token):
            return self.observe(event)
        if isinstance(event, Done) and event.finish_reason != "aborted":
            return self.finished(event)
        return None

    def _uncertain_start(self) -> Trigger | None:
        t = self.thresholds
        window = t.min_tokens
        if len(self._entropies) >= window and fmean(self._entropies) > t.max_entropy:
            return Trigger("low-confidence", f"uncertain start: mean entropy "
                                             f"{fmean(self._entropies):.2f} nats > {t.max_entropy:.2f} "
                                             f"over {window} tokens (at token {self.tokens_seen})")
        if len(self._margins) >= window and fmean(self._margins) < t.min_margin:
            return Trigger("low-confidence", f"uncertain start: mean top-2 margin "
                                             f"{fmean(self._margins):.2f} < {t.min_margin:.2f} "
                                             f"over {window} tokens (at token {self.tokens_seen})")
        return None

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
