"""What to send to a remote model whose context budget is given in tokens.

A remote is stateless: each request carries the whole prompt, so there is no KV cache to shift and
the choice is simply the newest turns that fit. Counts here are *estimates* in the remote's
tokenizer (see ``localchat.remote.context.estimate_tokens``); the caller leaves its own margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localchat.session.budget import TurnSpan
from localchat.session.overlong import OverlongDecision


@dataclass(frozen=True)
class RemoteSelection:
    """The prompt to send: system prompt, the summary when ``include_summary``, the history turns
    in ``turns`` (consecutive indices, newest last), and the new message. ``prompt_tokens`` is the
    estimate of all that. When ``fits`` is false, ``overlong`` gives the numbers to show."""

    fits: bool
    turns: range
    include_summary: bool
    prompt_tokens: int
    overlong: OverlongDecision | None = None


def select_for_remote(
    budget_tokens: int,
    system_tokens: int,
    history: Sequence[TurnSpan],
    new_tokens: int,
    *,
    reply_reserve: int,
    summary_tokens: int = 0,
    summary_through: int = -1,
) -> RemoteSelection:
    """Select the newest whole turns of ``history`` (the session's history, oldest first, turn
    indices counted from 0, including turns trimmed from the local context) that fit
    ``budget_tokens`` next to the system prompt, the new message and ``reply_reserve``.

    When the history from turn 0 fits it is sent as is: the summary would only repeat it.
    Otherwise the summary (of turns 0 .. ``summary_through``) goes in when it fits, and the newest
    turns fill the rest; verbatim turns the summary also covers may be sent with it, which
    repeats but never contradicts.
    """
    room = budget_tokens - reply_reserve - system_tokens - new_tokens
    if room < 0:
        overlong = OverlongDecision(
            "refuse",
            message_tokens=new_tokens,
            available_tokens=budget_tokens - reply_reserve - system_tokens,
            n_ctx=budget_tokens,
            system_tokens=system_tokens,
            reply_reserve=reply_reserve,
        )
        return RemoteSelection(False, range(0), False, system_tokens + new_tokens, overlong)

    n_sent, sent_tokens = _newest_that_fit(history, room)
    # The running summary folds every turn from the first (index 0) through summary_through, so
    # it adds something exactly when the turns sent do not reach back to turn 0.
    reaches_first = n_sent > 0 and history[len(history) - n_sent].index == 0
    has_summary = summary_tokens > 0 and summary_through >= 0
    include_summary = has_summary and not reaches_first and summary_tokens <= room
    if include_summary:
        n_sent, sent_tokens = _newest_that_fit(history, room - summary_tokens)
    sent = history[len(history) - n_sent :]
    return RemoteSelection(
        fits=True,
        turns=range(sent[0].index, sent[-1].index + 1) if sent else range(0),
        include_summary=include_summary,
        prompt_tokens=system_tokens
        + new_tokens
        + sent_tokens
        + (summary_tokens if include_summary else 0),
    )


def _newest_that_fit(history: Sequence[TurnSpan], room: int) -> tuple[int, int]:
    """(how many of the newest turns fit in ``room``, their tokens). Stops at the first turn that
    does not fit: a gap in the middle of the history would confuse the model more than a shorter
    history."""
    n, tokens = 0, 0
    for turn in reversed(history):
        if tokens + turn.tokens > room:
            break
        n, tokens = n + 1, tokens + turn.tokens
    return n, tokens
