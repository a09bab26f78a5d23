"""Tool calls in a streamed reply: telling them apart from the answer, piece by piece.

:class:`ToolCallSplitter` is to tool calls what ``reasoning.ReasoningSplitter`` is to thinking
(and runs after it, on the answer): feed it each piece of the reply as it arrives and it returns,
in order, answer text and parsed :class:`~localchat.reply.calls.ToolCall` objects. The call's
marker and its raw JSON never come out as answer text; only what may still be the start of a
marker (``<tool_`` at the end of what arrived) is held back, plus trailing whitespace. How a
family opens a call is its ``reply.families`` entry (matched by ``reply.call_openers``); its JSON is read by ``lenient_json``, once, however
small the pieces; a call's body is read by ``reply.call_readers``.

At the end of the reply :meth:`~ToolCallSplitter.flush` releases what is held: a call still open
(the reply reached ``max_tokens``) comes out as a ToolCall marked incomplete, which must not run.
The same calls come out whatever the split points of the stream.
"""

from __future__ import annotations

from localchat.reply.call_openers import PARTIAL, Match, Opener, Partial, match
from localchat.reply.call_readers import Reader, reader_for
from localchat.reply.calls import ToolCall
from localchat.reply.families import FORMATS, ToolFormat

Piece = str | ToolCall

# Separators models put between back-to-back calls (Llama 3.2: {...}; {...}).
_BETWEEN_CALLS = " \t\r\n;"


class ToolCallSplitter:
    """Splits one reply, piece by piece, into answer text and tool calls (see the module)."""

    def __init__(self, fmt: ToolFormat | str, tool_names: tuple[str, ...] = ()) -> None:
        """``tool_names``: the tools offered, which make openings without a marker stricter (a
        reply that is JSON about someone's ``"name"`` stays an answer); leave empty to accept any
        name, as for a remote model's text."""
        self.format = FORMATS[fmt] if isinstance(fmt, str) else fmt
        self._openers = self.format.openers(tool_names)
        self._first_chars = frozenset().union(*(o.first_chars for o in self._openers))
        self._pending = ""
        self._at_start = True  # no answer text released yet
        self._after_call = False  # only calls and whitespace since the last call
        self._reader: Reader | None = None  # the call being read, which opens self._pending
        self.calls: list[ToolCall] = []  # every call so far, in order

    def __repr__(self) -> str:
        state = "in a call" if self._reader else "text"
        return f"<ToolCallSplitter {self.format.name} {state} pending={self._pending[:40]!r}>"

    @property
    def in_call(self) -> bool:
        """Whether the reply is inside a call now (a front end may show that one is coming)."""
        return self._reader is not None

    def feed(self, text: str) -> list[Piece]:
        """Answer text and calls released by this piece, in order (often empty or one string)."""
        if (not self._reader and not self._pending and not self._at_start and not self._after_call
                and text and text[-1:].strip() and not (self._first_chars & set(text))):
            return [text]  # the common case: plain answer text, nothing held back
        self._pending += text
        return self._advance(final=False)

    def flush(self) -> list[Piece]:
        """What is still held at the end of the reply (an open call comes out incomplete)."""
        out = self._advance(final=True)
        rest, self._pending = self._pending.rstrip(), ""
        self._release(out, rest)
        return out

    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if self._reader is not None:
                read = self._reader.step(self._pending, final)
                if read is None:
                    break
                calls, end = read
                out.extend(calls)
                self.calls.extend(calls)
                self._pending = self._pending[end:]
                self._reader = None
                self._after_call = True
                continue
            if not self._open_call(out):
                break
        return out

    def _open_call(self, out: list[Piece]) -> bool:
        """Release text up to the first call opening; True when a call opened."""
        if self._after_call:
            self._pending = self._pending.lstrip(_BETWEEN_CALLS)
        text = self._pending
        first = len(text) - len(text.lstrip())
        for i, ch in enumerate(text):
            if ch not in self._first_chars:
                continue
            found = self._match_at(text, i, at_start=(self._at_start or self._after_call)
                                   and i == first)
            if found is None:
                continue
            keep = len(text[:i].rstrip())
            self._release(out, text[:keep])
            if not isinstance(found, tuple):  # PARTIAL: wait for the text that decides
                self._pending = text[keep:]
                return False
            opener, head = found
            self._pending = text[i:]
            self._reader = reader_for(opener, _shifted(head, -i))
            return True
        keep = len(text.rstrip())
        self._release(out, text[:keep])
        self._pending = text[keep:]
        return False

    def _match_at(self, text: str, i: int,
                  at_start: bool) -> tuple[Opener, Match] | Partial | None:
        partial = False
        for opener in self._openers:
            if opener.at_start_only and not at_start:
                continue
            found = match(opener.pattern, text, i)
            if isinstance(found, Match):
                return opener, found
            partial = partial or found is PARTIAL
        return PARTIAL if partial else None

    def _release(self, out: list[Piece], text: str) -> None:
        if self._at_start or self._after_call:
            text = text.lstrip()
        if not text:
            return
        self._at_start = self._after_call = False
        if out and isinstance(out[-1], str):
            out[-1] += text
        else:
            out.append(text)


def _shifted(head: Match, by: int) -> Match:
    return Match(head.end + by, head.body + by, head.captured)
