"""A reply that is JSON is shown as a JSON block: the answer to a ``/format`` turn while it
streams and when it ends, and any stored reply that is a JSON object or array when a session
reopens (nothing about the format is stored: the reply is stored and reopens like any other)."""

from __future__ import annotations

import json

# While a JSON answer streams, its block opens with a fence longer than the usual three, so
# that a string holding ``` cannot close it; the finished answer gets the fence it needs.
STREAMING_FENCE = "````"


def is_json_reply(answer: str) -> bool:
    """Whether the whole answer is one JSON object or array."""
    text = answer.strip()
    if not text or text[0] not in "[{":
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):  # a reply nested thousands deep is not drawn as JSON
        return False
    return True


def fence_for(text: str) -> str:
    """A code fence longer than any run of backticks in ``text`` (a JSON string may hold one)."""
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def as_markdown(answer: str, *, json_block: bool = False) -> str:
    """``answer`` as the reply's Markdown: fenced as JSON when it is asked to be
    (``json_block``: a shaped turn, complete or not) or is a JSON object or array."""
    if not (json_block or is_json_reply(answer)):
        return answer
    text = answer.strip("\n")
    fence = fence_for(text)
    return f"{fence}json\n{text}\n{fence}"
