"""How much of a remote's reply is read: a server may ignore ``max_tokens`` and stream for ever.

:class:`TokenLimit` counts what arrives and says how much of a chunk fits within the limit the
user set; past it the client stops reading, keeps what fits and says so.
"""

from __future__ import annotations

# A reply cannot be longer than this many characters per token asked for: real tokens average
# about 4 (3 for code); a server that sends a megabyte per chunk is caught by this bound.
MAX_CHARS_PER_TOKEN = 8


class TokenLimit:
    """The reply's length against the ``max_tokens`` the request asked for. Without the remote
    model's tokenizer, a chunk with text counts as one token (real servers send at most one per
    chunk) and so do each :data:`MAX_CHARS_PER_TOKEN` characters of text: the larger of the two
    is what has arrived."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._chunks = 0
        self._chars = 0

    def room(self, text: str) -> int:
        """How many characters of a chunk carrying ``text`` fit within the limit: all of them,
        or fewer when the chunk would take the reply past it. What fits is counted."""
        if not text:
            return 0
        if self._chunks >= self.max_tokens:
            return 0
        fits = max(0, min(len(text), self.max_tokens * MAX_CHARS_PER_TOKEN - self._chars))
        if fits:
            self._chunks += 1
            self._chars += fits
        return fits
