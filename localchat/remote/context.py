"""Fitting the conversation into the remote model's context budget.

The remote's tokenizer is unknown here, so sizes are *estimated* from characters: about four
characters per token for English text and code with BPE vocabularies, plus a few tokens of
template overhead per message and a fixed cost per picture. The estimate is deliberately on the
generous side (it rounds up), so a trimmed conversation fits; it is not exact and is not meant for
billing.

A remote is stateless: each request carries the whole prompt, so there is no KV cache to shift and
the choice (:func:`select_for_remote`) is simply the newest whole turns that fit; the caller's
counts are estimates in the remote's tokenizer and it leaves its own margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from localchat.context.budget import TurnSpan
from localchat.context.oversized_message import OverlongDecision
from localchat.reply.reasoning import strip_reasoning

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators of a typical chat template
# A picture's cost is the remote model's own (Gemma 3: 256 tokens; Qwen2.5-VL and OpenAI's high
# detail: several hundred to over a thousand, by size): this errs high, as the text estimate does.
IMAGE_TOKENS = 768


def estimate_tokens(text: str) -> int:
    """Rough token count of ``text`` (chars / 4, rounded up)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_message_tokens(messages: list[dict]) -> int:
    return sum(estimate_tokens(str(m.get("content") or "")) + MESSAGE_OVERHEAD_TOKENS
               + IMAGE_TOKENS * len(m.get("images") or ()) for m in messages)


def trim_to_budget(messages: list[dict], max_context_tokens: int, reserve_tokens: int) -> list[dict]:
    """The conversation with its oldest turns dropped until it fits the remote's budget.

    ``messages`` is the conversation as the local model sees it (system prompt, summary, kept
    turns, and the new user message last); earlier replies lose their reasoning. System messages and the last message are always kept;
    other messages are dropped oldest first, a user message together with the replies that follow
    it so that the remote never sees a reply without its question. ``reserve_tokens`` is kept free
    for the reply. If even the kept messages exceed the budget they are sent as they are and the
    remote decides (it reports an over-long prompt as an error, which the caller shows).
    """
    if not messages:
        return []
    # Earlier replies' reasoning stays home: remotes take answers only (and it costs tokens).
    messages = [{**m, "content": strip_reasoning(m["content"])} if m.get("role") == "assistant"
                else m for m in messages]
    system = [m for m in messages[:-1] if m.get("role") == "system"]
    turns = _group_turns([m for m in messages[:-1] if m.get("role") != "system"])
    last = messages[-1]
    # The choice itself: newest whole turns, contiguous (select_for_remote below).
    selection = select_for_remote(
        max_context_tokens,
        estimate_message_tokens(system),
        [TurnSpan(i, estimate_message_tokens(turn)) for i, turn in enumerate(turns)],
        estimate_message_tokens([last]),
        reply_reserve=reserve_tokens,
    )
    history = [m for i in selection.turns for m in turns[i]] if selection.fits else []
    return [*system, *history, last]


def _group_turns(messages: list[dict]) -> list[list[dict]]:
    """Split non-system messages into turns that each start at a user message."""
    turns: list[list[dict]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


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
