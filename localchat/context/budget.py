"""The context budget: what the model sees on each turn, and what to drop when it would not fit.

Plain logic over exact token counts; no model is needed. The model's context is laid out as

    [system prompt][summary][turn i] ... [turn k][new message + assistant header]  + reply

where a *turn* is one whole user + assistant exchange and the summary (possibly empty) folds the
turns that were trimmed away. Every plan keeps the promise

    system + summary + kept turns + new message + reply_reserve <= n_ctx.

How a session uses it, per turn:

- before submitting: ``plan_turn(settings, context, new_tokens)``. If ``fits``, apply the plan to
  the KV cache (remove ``plan.drop``, and the summary when ``plan.summary_action == "remove"``),
  then prefill the new message. If not, ``plan.overlong`` says whether to refuse (with the
  numbers) or cut the message's middle and plan again.
- after ``Done``: append the finished exchange to ``plan.context`` and ask
  ``should_prepare_summary``; when it returns a request, build that summary in the background and
  swap it in when it is ready (the session does that, between turns). A summary that is not
  ready is never waited for: a trim goes ahead and keeps the old summary.

Trimming only changes what the model sees; the session's history keeps every turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from localchat.context.oversized_message import (
    DEFAULT_MARKER_TOKENS,
    OverlongDecision,
    overlong_message,
)
from localchat.settings import ContextSection, OverlongPolicy, check_setting

SummaryAction = Literal["keep", "remove"]


@dataclass(frozen=True)
class ContextSettings:
    """How the context budget is managed. Token counts are exact (the local tokenizer's).

    ``reply_reserve`` tokens are always kept free for the reply. When trimming, at least
    ``trim_fraction`` of ``n_ctx`` is freed *beyond* what this turn needs, so the next turn
    of typical size does not trim again. ``summary_max_tokens`` caps the running summary;
    ``summarize`` off means trimmed turns are simply dropped. ``overlong`` is the policy for one
    message that cannot fit even next to the system prompt alone: ``"refuse"`` (with the numbers)
    or ``"head_tail"`` (keep its beginning and end around ``overlong_marker``, whose ``{cut}`` is
    replaced by the number of tokens cut). A background summary is started once the context is
    ``summarize_threshold`` full (as a fraction of the tokens a prompt may use).
    """

    n_ctx: int
    reply_reserve: int
    # The defaults and ranges of the settings ``[context]`` sets are the schema's (one home).
    trim_fraction: float = ContextSection.trim_fraction
    summary_max_tokens: int = ContextSection.summary_max_tokens
    summarize: bool = ContextSection.summarize
    overlong: OverlongPolicy = ContextSection.overlong
    overlong_marker: str = "[… {cut} tokens cut …]"
    summarize_threshold: float = ContextSection.summarize_threshold

    def __post_init__(self) -> None:
        # Programmer errors: settings come from ``for_reply`` or a validated config.
        if self.n_ctx < 1:
            raise ValueError(f"n_ctx must be positive, got {self.n_ctx}")
        if not 0 <= self.reply_reserve < self.n_ctx:
            raise ValueError(
                f"reply_reserve must be in [0, n_ctx={self.n_ctx}), got {self.reply_reserve}"
            )
        for name in ("trim_fraction", "summary_max_tokens", "summarize_threshold"):
            value = getattr(self, name)
            problem = check_setting(f"context.{name}", value)
            if problem:
                raise ValueError(f"{name} {problem}, got {value}")
        if self.overlong not in get_args(OverlongPolicy):
            raise ValueError(f'overlong must be "refuse" or "head_tail", got {self.overlong!r}')
        if not self.overlong_marker.strip():
            raise ValueError("overlong_marker must be visible text")

    @classmethod
    def for_reply(cls, n_ctx: int, max_tokens: int, **options) -> ContextSettings:
        """Settings whose reply reserve is ``max_tokens``, capped at half the context.

        Without the cap a large ``max_tokens`` (or one meaning "up to the context size") would
        leave no room for the conversation itself; a reply longer than the reserve still runs,
        it just ends with finish_reason "length" at the context's end.
        """
        return cls(n_ctx=n_ctx, reply_reserve=reply_reserve(n_ctx, max_tokens), **options)

    @property
    def prompt_capacity(self) -> int:
        """Most tokens the prompt (everything but the reply) may occupy."""
        return self.n_ctx - self.reply_reserve

    @property
    def summary_start(self) -> float:
        """Tokens in context from which a background summary starts: ``summarize_threshold`` of
        the prompt's capacity (not of n_ctx: trimming starts there)."""
        return self.summarize_threshold * self.prompt_capacity

    @property
    def trim_margin(self) -> int:
        """Tokens a trim frees beyond this turn's needs (``trim_fraction`` of ``n_ctx``, rounded up)."""
        return math.ceil(self.trim_fraction * self.n_ctx)


def reply_reserve(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the reply: ``max_tokens``, capped at half the context (see
    ``ContextSettings.for_reply``)."""
    return max(0, min(max_tokens, n_ctx // 2))


def draft_may_be_prefilled(settings: ContextSettings, tokens_with_draft: int) -> bool:
    """Whether a draft that would bring the context to ``tokens_with_draft`` (the draft as the
    next user message, with its template tokens) may be prefilled while it is typed.

    Only below the point where a summary starts: there the next turn cannot need a trim, which
    would shift cached turns down and needs the cache to end with the conversation, not with a
    draft (see ``context/draft.py``).
    """
    return tokens_with_draft <= settings.summary_start


def message_room(n_ctx: int, max_tokens: int) -> int:
    """Most tokens one message (with its attached files) may hold: the context less the reply
    reserve. A file that alone would not fit this is refused before anything is sent."""
    return n_ctx - reply_reserve(n_ctx, max_tokens)


@dataclass(frozen=True)
class TurnSpan:
    """One whole user + assistant exchange in the context: its turn number and its tokens."""

    index: int
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"turn {self.index} has a negative token count {self.tokens}")


@dataclass(frozen=True)
class ContextLayout:
    """What the model's context holds before a new turn, in order.

    ``summary_through`` is the newest turn folded into the running summary (-1: none yet). Turns
    between it and the oldest turn in context were dropped without being summarized (a trim came
    before the summary was ready); the next summary folds them in from the session's history.
    ``turns`` are consecutive, oldest first, and all newer than ``summary_through``.
    """

    system_tokens: int
    summary_tokens: int = 0
    summary_through: int = -1
    turns: tuple[TurnSpan, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))
        if self.system_tokens < 0 or self.summary_tokens < 0:
            raise ValueError("token counts must be >= 0")
        indices = [turn.index for turn in self.turns]
        if indices and indices != list(range(indices[0], indices[0] + len(indices))):
            raise ValueError(f"turns in context must be consecutive, got {indices}")
        if indices and indices[0] <= self.summary_through:
            raise ValueError(
                f"turn {indices[0]} is both in context and in the summary"
                f" (through {self.summary_through})"
            )

    @property
    def turn_tokens(self) -> int:
        return sum(turn.tokens for turn in self.turns)

    @property
    def used_tokens(self) -> int:
        """Tokens in the KV cache: system prompt + summary + turns."""
        return self.system_tokens + self.summary_tokens + self.turn_tokens

    def with_turn(self, turn: TurnSpan) -> ContextLayout:
        """This context after a finished exchange (new message + reply) was appended."""
        turns = (*self.turns, turn)
        return ContextLayout(self.system_tokens, self.summary_tokens, self.summary_through, turns)


@dataclass(frozen=True)
class TurnPlan:
    """What to do to the context before a new turn, and what the context is afterwards.

    ``drop`` is the range of turn indices to remove: the oldest whole turns after the summary,
    never a part of a turn. ``summary_action`` says what happens to the summary: "keep" it, or
    "remove" it (only when nothing but the system prompt and the new message fit). ``context`` is
    the layout after the plan, before the new message. When ``fits`` is false nothing is changed
    and ``overlong`` says what to do.
    """

    fits: bool
    context: ContextLayout
    new_tokens: int
    drop: range = range(0)
    dropped_tokens: int = 0
    summary_action: SummaryAction = "keep"
    summary_before: int = 0
    overlong: OverlongDecision | None = None

    @property
    def summary_tokens(self) -> int:
        """Tokens of summary in context after the plan (``Timings.summary_n``)."""
        return self.context.summary_tokens

    @property
    def trimmed(self) -> bool:
        return bool(self.drop) or self.summary_action != "keep"

    @property
    def trimmed_n(self) -> int:
        """Tokens removed from the KV cache (``Timings.trimmed_n``): dropped turns, plus the
        summary when it is removed."""
        return self.dropped_tokens + (self.summary_before if self.summary_action != "keep" else 0)

    @property
    def shift(self) -> int:
        """How far the kept turns' positions move (negative: down)."""
        return self.summary_tokens - self.summary_before - self.dropped_tokens

    @property
    def prompt_tokens(self) -> int:
        """Tokens in context once the new message is in."""
        return self.context.used_tokens + self.new_tokens


def plan_turn(settings: ContextSettings, context: ContextLayout, new_tokens: int, *,
              new_overhead_tokens: int = 0, marker_tokens: int = DEFAULT_MARKER_TOKENS) -> TurnPlan:
    """Plan the context for a new message of ``new_tokens`` (message + template tokens around it,
    ``new_overhead_tokens`` of which are template).

    Nothing is dropped while everything fits. Otherwise the oldest whole turns are dropped until
    ``trim_margin`` tokens are free beyond this turn's needs, but the newest exchange is kept
    (coherence wins over the margin) unless the new message fits no other way; only then the
    summary goes too. A message that cannot
    fit even next to the system prompt alone gets ``overlong`` and ``fits=False``.
    """
    summary_before = context.summary_tokens
    if context.used_tokens + new_tokens <= settings.prompt_capacity:
        return TurnPlan(True, context, new_tokens, summary_before=summary_before)

    overlong = overlong_message(
        settings,
        context.system_tokens,
        new_tokens - new_overhead_tokens,
        overhead_tokens=new_overhead_tokens,
        marker_tokens=marker_tokens,
    )
    if overlong is not None:
        return TurnPlan(False, context, new_tokens, summary_before=summary_before, overlong=overlong)

    # The summary stays unless it cannot fit beside the system prompt and the new message.
    keep = context.system_tokens + context.summary_tokens + new_tokens <= settings.prompt_capacity
    action: SummaryAction = "keep" if keep else "remove"
    summary_tokens, summary_through = (context.summary_tokens if keep else 0), context.summary_through
    fixed = context.system_tokens + summary_tokens + new_tokens
    n_drop = _turns_to_drop(
        context.turns,
        target_room=settings.prompt_capacity - settings.trim_margin - fixed,
        hard_room=settings.prompt_capacity - fixed,
        covered_through=summary_through,
    )
    dropped = context.turns[:n_drop]
    after = ContextLayout(context.system_tokens, summary_tokens, summary_through, context.turns[n_drop:])
    return TurnPlan(
        fits=True,
        context=after,
        new_tokens=new_tokens,
        drop=range(dropped[0].index, dropped[-1].index + 1) if dropped else range(0),
        dropped_tokens=sum(turn.tokens for turn in dropped),
        summary_action=action,
        summary_before=summary_before,
    )


def _turns_to_drop(
    turns: Sequence[TurnSpan], *, target_room: int, hard_room: int | None, covered_through: int
) -> int:
    """How many of the oldest ``turns`` to drop so that the rest fit in ``target_room``.

    The newest turn is kept even when that misses the target, and dropped only when it does not
    fit ``hard_room`` (``None``: never). Turns up to ``covered_through`` are in the summary that
    will be in context, so they are dropped too rather than kept twice (even the newest, which
    a summary requested by ``should_prepare_summary`` never covers).
    """
    kept_tokens = sum(turn.tokens for turn in turns)
    n_drop = 0
    while n_drop < len(turns) and (
        turns[n_drop].index <= covered_through or (kept_tokens > target_room and n_drop < len(turns) - 1)
    ):
        kept_tokens -= turns[n_drop].tokens
        n_drop += 1
    if hard_room is not None and kept_tokens > hard_room:
        n_drop = len(turns)
    return n_drop


@dataclass(frozen=True)
class SummaryRequest:
    """A summary to build in the background: fold the current summary (when ``fold_summary``)
    and turns ``first`` .. ``through`` (from the session's history: some may already be out of
    the context) into at most ``max_tokens`` tokens. Because the old summary is an input and the
    output is capped, the summary stays under the cap however long the chat gets."""

    first: int
    through: int
    fold_summary: bool
    max_tokens: int

    @property
    def turns(self) -> range:
        return range(self.first, self.through + 1)


def should_prepare_summary(
    settings: ContextSettings,
    context: ContextLayout,
    *,
    in_flight: SummaryRequest | None = None,
) -> SummaryRequest | None:
    """After a reply: which turns a background summary should cover now, or None.

    ``context`` includes the exchange that just finished; ``in_flight`` is a summary being built. A summary is requested once the context
    is ``summarize_threshold`` full, or when the next exchange, assumed as large as the last one,
    would make ``plan_turn`` trim. It covers the turns that trim is predicted to drop (assuming
    the new summary takes its full cap), never the newest exchange, plus any turns dropped before
    a summary was ready. One in flight is never replaced (restarting it on every turn could keep
    any summary from ever finishing).
    """
    if not settings.summarize or not context.turns or in_flight is not None:
        return None
    capacity = settings.prompt_capacity
    next_new = context.turns[-1].tokens  # an over-estimate: it includes a reply
    trim_is_next = context.used_tokens + next_new > capacity
    full = context.used_tokens >= settings.summary_start
    if not (full or trim_is_next):
        return None

    fixed = context.system_tokens + settings.summary_max_tokens + next_new
    n_drop = _turns_to_drop(
        context.turns,
        target_room=capacity - settings.trim_margin - fixed,
        hard_room=None,
        covered_through=-1,
    )
    # With nothing predicted to drop, still fold the turns already dropped unsummarized.
    through = context.turns[n_drop - 1].index if n_drop else context.turns[0].index - 1
    if through <= context.summary_through:
        return None
    return SummaryRequest(
        first=context.summary_through + 1,
        through=through,
        fold_summary=context.summary_through >= 0,
        max_tokens=settings.summary_max_tokens,
    )
