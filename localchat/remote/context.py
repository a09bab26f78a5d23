"""Fitting the conversation into the remote model's context budget.

The remote's tokenizer is unknown here, so sizes are *estimated* from characters: about four
characters per token for English text and code with BPE vocabularies, plus a few tokens of
template overhead per message. The estimate is deliberately on the generous side (it rounds up),
so a trimmed conversation fits; it is not exact and is not meant for billing.
"""

from __future__ import annotations

import math

from localchat.reasoning import strip_reasoning
from localchat.session.budget import TurnSpan
from localchat.session.remote_budget import select_for_remote

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators of a typical chat template


def estimate_tokens(text: str) -> int:
    """Rough token count of ``text`` (chars / 4, rounded up)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_message_tokens(messages: list[dict]) -> int:
    return sum(estimate_tokens(str(m.get("content") or "")) + MESSAGE_OVERHEAD_TOKENS for m in messages)


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
    # The choice itself (newest whole turns, contiguous) is the session's remote budget policy.
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
