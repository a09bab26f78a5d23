"""Tool calls in a streamed reply: telling them apart from the answer, piece by piece.

:class:`ToolCallSplitter` is to tool calls what ``reasoning.ReasoningSplitter`` is to thinking
(and runs after it, on the answer): feed it each piece of the reply as it arrives and it returns,
in order, answer text and parsed :class:`~localchat.toolcalls.ToolCall` objects. The call's
marker and its raw JSON never come out as answer text; only what may still be the start of a
marker (``<tool_`` at the end of what arrived) is held back, plus trailing whitespace. How a
family opens a call is ``toolcall_patterns``; its JSON is read by ``lenient_json``, once, however
small the pieces.

At the end of the reply :meth:`~ToolCallSplitter.flush` releases what is held: a call still open
(the reply reached ``max_tokens``) comes out as a ToolCall marked incomplete, which must not run.
The same calls come out whatever the split points of the stream.
"""

from __future__ import annotations

import re
from typing import Protocol

from localchat import lenient_json
from localchat.toolcall_patterns import (
    MISTRAL_NAMED,
    PARTIAL,
    Match,
    Opener,
    Partial,
    match,
    openers_for,
)
from localchat.toolcalls import (
    FORMATS,
    ToolCall,
    ToolFormat,
    call_from_object,
    calls_from_json,
    mark_incomplete,
    new_call_id,
)

Piece = str | ToolCall

# Separators models put between back-to-back calls (Llama 3.2: {...}; {...}).
_BETWEEN_CALLS = " \t\r\n;"


class _Reader(Protocol):
    def step(self, text: str, final: bool) -> tuple[list[ToolCall], int] | None:
        """(calls, end) once the call that opened ``text`` has been read, ``end`` just past it;
        None while more text is needed (never when ``final``)."""


class ToolCallSplitter:
    """Splits one reply, piece by piece, into answer text and tool calls (see the module)."""

    def __init__(self, fmt: ToolFormat | str, tool_names: tuple[str, ...] = ()) -> None:
        """``tool_names``: the tools offered, which make openings without a marker stricter (a
        reply that is JSON about someone's ``"name"`` stays an answer); leave empty to accept any
        name, as for a remote model's text."""
        self.format = FORMATS[fmt] if isinstance(fmt, str) else fmt
        self._openers = openers_for(self.format.name, tool_names)
        self._first_chars = frozenset().union(*(o.first_chars for o in self._openers))
        self._pending = ""
        self._at_start = True  # no answer text released yet
        self._after_call = False  # only calls and whitespace since the last call
        self._reader: _Reader | None = None  # the call being read, which opens self._pending
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
            self._reader = _reader_for(opener, _shifted(head, -i))
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


def _reader_for(opener: Opener, head: Match) -> _Reader:
    if opener.body == "python":
        return _PythonReader(head.body)
    if opener.body == "mistral":
        return _MistralReader(head.body)
    name = head.get("name") if opener.body == "arguments" else None
    return _JsonReader(head.body, opener.closes, name=name)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _bad_call(problem: str, raw: str) -> ToolCall:
    return ToolCall(new_call_id(), "", problem=problem, raw=raw)


class _JsonReader:
    """A call whose body is one JSON value, then optional closing tags. With ``name`` the value
    is the arguments of that tool (``<function=NAME>{...}``), else the call object itself."""

    def __init__(self, start: int, closes: tuple[str, ...], name: str | None = None,
                 call_id: str = "") -> None:
        self.start, self.closes, self.name, self.call_id = start, closes, name, call_id
        self._walker: lenient_json.Walker | None = None
        self._json_start = -1
        self._searched = 0  # where the next search for a closing tag starts

    def step(self, text: str, final: bool) -> tuple[list[ToolCall], int] | None:
        if self._walker is None:
            p = _skip_space(text, self.start)
            if p == len(text):
                if not final:
                    return None
                return [mark_incomplete(_bad_call("", text))], len(text)
            if text[p] not in "{[":
                return self._not_json(text, p, final)
            self._json_start = self._searched = p
            self._walker = lenient_json.Walker(text, p)
        else:
            self._walker.extend(text[len(self._walker.source):])
        end = self._walker.run(final)
        if end is None:
            closed = self._closed_early(text)
            if closed is not None:
                return closed
            if not final:
                return None
            body = text[self._json_start:]
            return self._calls(body, text), len(text)
        after = _consume_closes(text, end, self.closes, final)
        if after is None:
            return None
        return self._calls(text[self._json_start:end], text[:after]), after

    def _calls(self, body: str, raw: str) -> list[ToolCall]:
        if self.name is None:
            return calls_from_json(body, raw=raw)
        try:
            arguments, complete = lenient_json.parse(body)
        except ValueError as exc:
            return [ToolCall(self.call_id or new_call_id(), self.name, raw=raw,
                             problem=f"the arguments of {self.name} are not valid JSON ({exc})")]
        call = call_from_object({"name": self.name, "arguments": arguments},
                                default_id=self.call_id, raw=raw)
        return [call if complete else mark_incomplete(call)]

    def _closed_early(self, text: str) -> tuple[list[ToolCall], int] | None:
        """The model closed the call's tag before its JSON was complete (a missing brace is what
        small models most often get wrong): read what it wrote, healed, as the call."""
        if not self.closes:
            return None
        close = self.closes[0]
        while True:
            at = text.find(close, self._searched)
            if at < 0:
                self._searched = max(self._json_start, len(text) - len(close) + 1)
                return None
            self._searched = at + 1
            before = lenient_json.Walker(text[:at], self._json_start)
            before.run(final=True)
            if not before.quote:  # not inside a string argument: the tag really closes the call
                after = _consume_closes(text, at, self.closes, final=True) or at + len(close)
                return calls_from_json(before.healed(), raw=text[:after]), after

    def _not_json(self, text: str, p: int, final: bool) -> tuple[list[ToolCall], int] | None:
        problem = "the tool call is not a JSON object"
        if self.closes:
            at = text.find(self.closes[0], p)
            if at >= 0:
                after = _consume_closes(text, at, self.closes, final=True) or at
                return [_bad_call(problem, text[:after])], after
        if not final and self.closes:
            return None
        return [_bad_call(problem, text)], len(text)


def _consume_closes(text: str, pos: int, closes: tuple[str, ...], final: bool) -> int | None:
    """Just past the closing tags that follow ``pos`` (each optional, whitespace before each);
    None while the text ends where a closing tag may still come."""
    for close in closes:
        p = _skip_space(text, pos)
        rest = text[p:p + len(close)]
        if rest == close:
            pos = p + len(close)
        elif close.startswith(rest) and not final:
            return None  # the text ends inside (or right before) the tag
    return pos


class _PythonReader:
    """After Llama 3's ``<|python_tag|>``: a call object, or a builtin's ``name.call(k=v, ...)``,
    or raw code for a ``python`` tool (which runs to the end of the reply)."""

    _CALL = re.compile(r"([A-Za-z_][\w-]*)\s*\.\s*call\(")

    def __init__(self, start: int) -> None:
        self.start = start
        self._json: _JsonReader | None = None

    def step(self, text: str, final: bool) -> tuple[list[ToolCall], int] | None:
        if self._json is not None:
            return self._json.step(text, final)
        p = _skip_space(text, self.start)
        if p == len(text):
            return ([], len(text)) if final else None
        if text[p] in "{[":
            self._json = _JsonReader(p, ())
            return self._json.step(text, final)
        head = self._CALL.match(text, p)
        if head is not None:
            return self._builtin_call(text, head, final)
        if not final:
            return None
        return [call_from_object({"name": "python", "arguments": {"code": text[p:].strip()}},
                                 raw=text)], len(text)

    def _builtin_call(self, text: str, head: re.Match[str],
                      final: bool) -> tuple[list[ToolCall], int] | None:
        end = _closing_paren(text, head.end())
        if end is None:
            if not final:
                return None
            call = ToolCall(new_call_id(), head.group(1), raw=text)
            return [mark_incomplete(call)], len(text)
        arguments = _keyword_arguments(text[head.end():end - 1])
        if arguments is None:
            return [ToolCall(new_call_id(), head.group(1), raw=text[:end],
                             problem=f"the arguments of {head.group(1)} could not be read")], end
        return [call_from_object({"name": head.group(1), "arguments": arguments},
                                 raw=text[:end])], end


def _closing_paren(text: str, pos: int) -> int | None:
    """Just past the ``)`` that closes a call whose arguments start at ``pos``."""
    depth, quote, escaped = 0, "", False
    for i in range(pos, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i + 1 if ch == ")" else None
            depth -= 1
    return None


_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def _keyword_arguments(text: str) -> dict[str, object] | None:
    """``query="x", limit=3`` as a dict (values read as lenient JSON), or None."""
    if not text.strip():
        return {}
    # Turn key=value pairs into a JSON object's key: value pairs, outside quoted values.
    pieces, pos = [], 0
    while pos < len(text):
        key = _KEYWORD.match(text, pos)
        if key is None:
            return None
        value_end = _value_end(text, key.end())
        pieces.append(f'"{key.group(1)}": {text[key.end():value_end].strip()}')
        pos = value_end + 1  # past the comma
    try:
        value, complete = lenient_json.parse("{" + ", ".join(pieces) + "}")
    except ValueError:
        return None
    return value if complete and isinstance(value, dict) else None


def _value_end(text: str, pos: int) -> int:
    depth, quote, escaped = 0, "", False
    for i in range(pos, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return i
    return len(text)


class _MistralReader:
    """After ``[TOOL_CALLS]``: a JSON array (or object) of calls, or ``name[ARGS]{...}``."""

    def __init__(self, start: int) -> None:
        self.start = start
        self._json: _JsonReader | None = None

    def step(self, text: str, final: bool) -> tuple[list[ToolCall], int] | None:
        if self._json is not None:
            return self._json.step(text, final)
        p = _skip_space(text, self.start)
        if p == len(text):
            return ([mark_incomplete(_bad_call("", text))], len(text)) if final else None
        if text[p] in "{[":
            self._json = _JsonReader(p, ())
            return self._json.step(text, final)
        named = match(MISTRAL_NAMED, text, p)
        if isinstance(named, Match):
            self._json = _JsonReader(named.body, (), name=named.get("name"),
                                     call_id=named.get("id"))
            return self._json.step(text, final)
        if named is PARTIAL and not final:
            return None
        if named is PARTIAL:
            return [mark_incomplete(_bad_call("", text))], len(text)
        return [_bad_call("[TOOL_CALLS] is not followed by a call", text[:p])], p
