"""Reading one tool call's body, once its opening has been found in the reply.

``reply.call_stream`` finds where a call opens (``reply.call_openers``) and hands the text from
there to the reader for that opening: a JSON value then optional closing tags (hermes, Llama 3's
bare object, Mistral's array), Llama 3's ``<|python_tag|>`` forms, or Mistral's
``name[ARGS]{...}``. A reader is fed the whole text of the call so far each time more arrives
and reads its JSON once (``lenient_json.Walker``); it says when the call ended, and with
``final`` (the reply ended) it always answers, marking a call that was cut off incomplete.
"""

from __future__ import annotations

import re
from typing import Protocol

from localchat.reply import lenient_json
from localchat.reply.call_openers import MISTRAL_NAMED, PARTIAL, Match, Opener, match
from localchat.reply.calls import (
    ToolCall,
    call_from_object,
    calls_from_json,
    mark_incomplete,
    new_call_id,
)


class Reader(Protocol):
    def step(self, text: str, final: bool) -> tuple[list[ToolCall], int] | None:
        """(calls, end) once the call that opened ``text`` has been read, ``end`` just past it;
        None while more text is needed (never when ``final``)."""


def reader_for(opener: Opener, head: Match) -> Reader:
    """The reader of a call whose opening ``opener`` matched as ``head`` (at index 0)."""
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
    None while the text ends where a closing tag may still come. At the end of the reply
    (``final``) the start of a tag it ended inside is taken too (never shown as answer text)."""
    for close in closes:
        p = _skip_space(text, pos)
        rest = text[p:p + len(close)]
        if rest == close:
            pos = p + len(close)
        elif close.startswith(rest) and not final:
            return None  # the text ends inside (or right before) the tag
        elif rest and close.startswith(rest):
            return p + len(rest)  # the reply ended inside the tag: its start is the call's too
    return pos


class _PythonReader:
    """After Llama 3's ``<|python_tag|>``: a call object, or a builtin's ``name.call(k=v, ...)``,
    or raw code for a ``python`` tool (which runs to the end of the reply)."""

    _CALL = re.compile(r"([A-Za-z_][\w-]*)\s*\.\s*call\(")

    def __init__(self, start: int) -> None:
        self.start = start
        self._json: _JsonReader | None = None
        self._seen = start  # a builtin call is looked at again only when a ")" arrives

    def step(self, text: str, final: bool) -> tuple[list[ToolCall], int] | None:
        if self._json is not None:
            return self._json.step(text, final)
        if not final and self._seen > self.start and ")" not in text[self._seen:]:
            self._seen = len(text)
            return None
        self._seen = len(text)
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
    at = _outside_quotes(text, pos, ")")
    return at + 1 if at is not None and text[at] == ")" else None


def _outside_quotes(text: str, pos: int, stops: str) -> int | None:
    """The index of the first of ``stops`` from ``pos`` that is outside quotes and brackets
    (or of a bracket that closes one opened before ``pos``); None if there is none."""
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
        elif depth == 0 and ch in stops:
            return i
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i
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
        value_end = _outside_quotes(text, key.end(), ",")
        if value_end is None:
            value_end = len(text)
        pieces.append(f'"{key.group(1)}": {text[key.end():value_end].strip()}')
        pos = value_end + 1  # past the comma
    try:
        value, complete = lenient_json.parse("{" + ", ".join(pieces) + "}")
    except ValueError:
        return None
    return value if complete and isinstance(value, dict) else None


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
