"""The openings of tool calls in a reply, and a matcher that also says "maybe".

A streamed reply arrives a token at a time, so the question at the end of what has arrived is
often not "is this a call?" but "could this still become one?" (``<tool_`` may be the start of
``<tool_call>``; ``{"na`` at the start of a reply may be a bare call object). :func:`match` answers
FULL (with where the head ends, where the call's JSON starts and a captured name), PARTIAL (the
text ran out while it still fitted) or no match, for patterns written as small sequences of
literals, optional whitespace, names, alternatives and marks. The pieces here (the hermes
openings, a call object's head) follow the openings llama.cpp's ``common/chat.cpp`` accepts;
``reply.families`` puts together each family's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal


class _Ws:
    """Zero or more whitespace characters."""


class _Body:
    """Marks where the call's JSON begins (the head that follows is part of it)."""


@dataclass(frozen=True)
class _Name:
    """A captured word: characters up to one of ``stop`` or whitespace (at least one), kept
    under ``key``."""

    stop: str
    key: str = "name"


@dataclass(frozen=True)
class _Alt:
    options: tuple[tuple, ...]


WS, BODY = _Ws(), _Body()
MAX_NAME = 128  # a captured name longer than any tool's (MCP allows 128) ends the match
Element = str | _Ws | _Body | _Name | _Alt
Seq = tuple[Element, ...]


def alt(*options: Seq) -> _Alt:
    return _Alt(options)


def opt(*seq: Element) -> _Alt:
    return _Alt((seq, ()))


# How a call's body is read once its opening matched (``reply.call_readers`` reads it).
BodyKind = Literal["call", "arguments", "python", "mistral"]


@dataclass(frozen=True)
class Opener:
    """One way a call can open: its pattern, how its body reads, the closing tags that may
    follow the JSON (each optional, in order), and whether it only counts at the reply's start."""

    pattern: Seq
    body: BodyKind = "call"
    closes: tuple[str, ...] = ()
    at_start_only: bool = False

    @property
    def first_chars(self) -> frozenset[str]:
        return _first_chars(self.pattern)


def _first_chars(seq: Seq) -> frozenset[str]:
    for element in seq:
        if isinstance(element, str):
            return frozenset(element[:1])
        if isinstance(element, _Alt):
            return frozenset().union(*(_first_chars(tuple(o) + seq[1:]) for o in element.options))
        if isinstance(element, _Body):
            continue
        return frozenset()  # a pattern may not open with whitespace or a name
    return frozenset()


@dataclass(frozen=True)
class Match:
    end: int  # just past the head
    body: int  # where the call's JSON starts (the head's end when no mark)
    captured: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str:
        return dict(self.captured).get(key, "")


class Partial:
    """The text ran out while a pattern still fitted."""

    def __repr__(self) -> str:
        return "PARTIAL"


PARTIAL = Partial()


def match(seq: Seq, text: str, pos: int) -> Match | Partial | None:
    """The first full match of ``seq`` at ``text[pos]`` (alternatives in order), else PARTIAL
    when the text ran out while the pattern still fitted, else None."""
    partial = False
    for found in _walk(seq, text, pos, -1, ()):
        if found is None:
            partial = True
        else:
            return found
    return PARTIAL if partial else None


def _walk(seq: Seq, text: str, pos: int, body: int,
          captured: tuple[tuple[str, str], ...]) -> Iterator[Match | None]:
    if not seq:
        yield Match(pos, body if body >= 0 else pos, captured)
        return
    element, rest = seq[0], seq[1:]
    if isinstance(element, str):
        chunk = text[pos:pos + len(element)]
        if chunk == element:
            yield from _walk(rest, text, pos + len(element), body, captured)
        elif len(chunk) < len(element) and element.startswith(chunk):
            yield None  # the text ends inside the literal
    elif isinstance(element, _Ws):
        end = pos
        while end < len(text) and text[end].isspace():
            end += 1
        yield from _walk(rest, text, end, body, captured)
    elif isinstance(element, _Body):
        yield from _walk(rest, text, pos, pos, captured)
    elif isinstance(element, _Name):
        end = pos
        limit = min(len(text), pos + MAX_NAME)
        while end < limit and text[end] not in element.stop and not text[end].isspace():
            end += 1
        if end == limit == pos + MAX_NAME:
            return  # no tool has a name this long: not an opening (and nothing to hold back)
        if end == len(text):
            yield None
        elif end > pos:
            yield from _walk(rest, text, end, body, (*captured, (element.key, text[pos:end])))
    else:
        for option in element.options:
            yield from _walk(tuple(option) + rest, text, pos, body, captured)


# A call object's first key, after which the object is surely a call: {"name" (hermes, llama 3,
# generic), optionally after "type": "function" (llama 3.2 writes it).
_KEY_NAME = alt(('"name"',), ("'name'",))
_TYPE_FUNCTION = opt(alt(('"type"',), ("'type'",)), WS, ":", WS, alt(('"function"',), ("'function'",)),
                     WS, ",", WS)
ENVELOPE_KEY = alt(('"tool_calls"',), ('"tool_call"',))

# Tags llama.cpp also accepts around a hermes call object ("common good bad outputs").
_WRAPPERS = ("function_call", "tools", "tool", "response", "json", "JSON", "xml")
_FENCE: Seq = ("```", opt(alt(("json",), ("xml",))), WS)


def call_head(names: tuple[str, ...]) -> Seq:
    """``{"name"``, and when the tools are known, ``: "one of them"`` too: without a marker,
    only a known tool's name tells a call from a JSON answer about someone's name (llama.cpp's
    lazy-grammar trigger asks the same)."""
    head: Seq = (BODY, "{", WS, _TYPE_FUNCTION, _KEY_NAME)
    if not names:
        return head
    quoted = alt(*((f'"{name}"',) for name in names), *((f"'{name}'",) for name in names))
    return (*head, WS, ":", WS, quoted)


def array_head(head: Seq) -> Seq:
    """``head`` as the first item of an array of calls (``[{"name"...``)."""
    return (BODY, "[", WS, *head[1:])


def hermes_openers(names: tuple[str, ...] = ()) -> tuple[Opener, ...]:
    """How calls open in the hermes form (``reply.families``: its own, and the generic
    family's); ``names`` (the tools offered) make the openings without a marker stricter."""
    head = call_head(names)
    return (
        Opener(("<tool_call>", WS, BODY), closes=("</tool_call>",)),
        *(Opener((f"<{tag}>", WS, *head), closes=(f"</{tag}>",)) for tag in _WRAPPERS),
        Opener(("<function=", _Name(">"), ">", WS, BODY), body="arguments", closes=("</function>",)),
        Opener(('<function name="', _Name('"'), '">', WS, BODY), body="arguments",
               closes=("</function>",)),
        Opener(head, at_start_only=True),
        Opener((*_FENCE, "<tool_call>", WS, BODY), closes=("</tool_call>", "```"),
               at_start_only=True),
        Opener((*_FENCE, *head), closes=("```",), at_start_only=True),
    )


# After [TOOL_CALLS] in Mistral's newer form: name[ARGS]{...} or name[CALL_ID]id[ARGS]{...}.
MISTRAL_NAMED: Seq = (_Name("["), opt("[CALL_ID]", _Name("[", key="id")), "[ARGS]", WS, BODY)


# Every marker a call's text may hold (the openings above, their closing tags, Llama's and
# Mistral's special words): what is left of a call that is not one, shown as text, without them.
_MARKER = re.compile(
    r"</?(?:tool_call|function_call|tools|tool|response|json|JSON|xml)>|<function=[^>\s]*>"
    r'|<function name="[^"]*">|</function>|<\|python_tag\|>|\[(?:TOOL_CALLS|ARGS|CALL_ID)\]'
    r"|```(?:json|xml)?")


def without_markers(text: str) -> str:
    """``text`` (a call as the model wrote it) without any call marker, stripped."""
    return _MARKER.sub("", text).strip()
