"""What a remote's 2xx answer must be before its text is a reply, and how much of it is read.

- It is read as a reply only if it is a stream of server-sent events: its first line a field
  (``data:``, ``event:``, ``id:``, ``retry:``) or a ``:`` comment, whatever its content type says.
  Anything else (a proxy's HTML login page, a whole JSON reply from a server that ignored
  ``"stream": true``, an empty body) is named for what it is, with its status, content type and
  first bytes, in one line, after reading no more than its first line: :func:`opening` and
  :func:`not_a_stream`. Asked again, the same server would answer the same, so it is not retried.
- Its events must be chat-completion chunks carrying text: a stream that ends with none
  (events without ``choices``, or chunks with nothing usable in them) is an error, never an empty
  reply to store (:func:`no_reply`).
- A server may ignore ``max_tokens``: :class:`TokenLimit` counts what arrives and says how much
  of a chunk fits within the limit the user set; past it the client stops reading.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from localchat.remote.sse import preview

# Enough of a body to show what it is, and to hold the first line of any event stream.
OPENING_BYTES = 1024
# A reply cannot be longer than this many characters per token asked for: real tokens average
# about 4 (3 for code); a server that sends a megabyte per chunk is caught by this bound.
MAX_CHARS_PER_TOKEN = 8

# Events a reply may take beyond its text: a role, a finish, usage, and empty deltas some servers
# send between tokens. Far more is a server that goes on without end.
EVENTS_PER_TOKEN = 4
SPARE_EVENTS = 64

_SSE_FIRST_LINE = re.compile(rb"^(?::|(?:data|event|id|retry)(?::|\r?$))")


def opening(chunks: Iterator[bytes]) -> bytes:
    """The body's first bytes: up to the end of its first line that is not blank, or
    :data:`OPENING_BYTES`, or the end of the body, whichever comes first. ``chunks`` goes on
    with the rest."""
    head = b""
    for data in chunks:
        head += data
        start = len(head) - len(head.lstrip())
        if b"\n" in head[start:] or len(head) >= OPENING_BYTES:
            break
    return head


def not_a_stream(where: str, status: int, content_type: str, head: bytes) -> str | None:
    """None if ``head`` (see :func:`opening`) starts an event stream; else the one line that
    says what the remote at ``where`` answered instead."""
    first = head.lstrip().removeprefix(b"\xef\xbb\xbf")
    if first and _SSE_FIRST_LINE.match(first.split(b"\n", 1)[0]):
        return None
    kind = content_type.split(";")[0].strip() or "no content type"
    if not first:
        return f"the remote at {where} answered {status} with an empty body ({kind}), not a stream"
    text = first[:OPENING_BYTES].decode("utf-8", errors="replace")
    return (f"the remote at {where} answered {status} with {kind}{_looks_like(text)}, not a "
            f"stream: {preview(text)!r}")


def _looks_like(text: str) -> str:
    lowered = text.lower()
    if lowered.startswith(("<!doctype html", "<html")) or "<html" in lowered[:200]:
        return " (a web page)"
    if text.startswith("{") and '"choices"' in text and '"message"' in text:
        return ' (a whole reply: the server ignored "stream": true)'
    if text.startswith("{") and '"error"' in text[:100]:
        return " (an error object)"
    return ""


def no_reply(where: str, events: int, chat_chunks: int, first_event: str) -> str:
    """The failure for a stream that ended without any text: what its events were."""
    if not events:
        return f"the remote at {where} ended its stream without sending any event"
    if not chat_chunks:
        return (f"the remote at {where} sent {events} event{'s' if events != 1 else ''} that "
                f"{'are' if events != 1 else 'is'} no chat-completion chunk (no 'choices'), "
                f"the first: {preview(first_event)!r}")
    return (f"the remote at {where} sent an empty reply: its {events} event"
            f"{'s' if events != 1 else ''} carried no text")


class TokenLimit:
    """The reply's length against the ``max_tokens`` the request asked for. Without the remote
    model's tokenizer, a chunk with text counts as one token (real servers send at most one per
    chunk) and so do each :data:`MAX_CHARS_PER_TOKEN` characters of text: the larger of the two
    is what has arrived. Events without text (a role, a finish, usage) are bounded too, so that
    a server sending empty chunks for ever is not read for ever. ``passed``: the stream went on
    past the limit (stop reading it)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.max_events = EVENTS_PER_TOKEN * max_tokens + SPARE_EVENTS
        self.passed = False
        self._events = self._chunks = self._chars = 0

    def room(self, text: str) -> int:
        """How many characters of the next event's ``text`` fit within the limit: all of them,
        or fewer when it takes the reply past the limit (then ``passed`` is set). What fits is
        counted."""
        self._events += 1
        if self._events > self.max_events:
            self.passed = True
            return 0
        if not text:
            return 0
        if self._chunks >= self.max_tokens:
            self.passed = True
            return 0
        fits = min(len(text), self.max_tokens * MAX_CHARS_PER_TOKEN - self._chars)
        self.passed = fits < len(text)
        self._chunks += 1
        self._chars += fits
        return fits
