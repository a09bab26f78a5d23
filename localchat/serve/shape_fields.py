"""The shape an OpenAI-style chat request asks its reply to take, from whichever field asks it:
OpenAI's ``response_format`` (``tool_fields.answer_format``), or llama-server's top-level
``grammar`` (GBNF text, its root rule ``root``) and ``json_schema`` (a JSON Schema object), which
clients written for llama-server send (its own tests, and tools built on it).

One shape per request: two of these fields at once is a 400 naming the second, since which one
should win is a guess. A grammar llama.cpp cannot parse is a 400 naming ``grammar`` in
llama.cpp's own words, before the request waits in the queue (a token named by its text, such
as ``<|im_end|>``, is checked against the model's vocabulary when the turn starts).
"""

from __future__ import annotations

from typing import Any

from localchat.errors import FormatError
from localchat.formats import AnswerFormat, grammar_format
from localchat.serve.fields import field_of
from localchat.serve.http_errors import BadRequest, bad
from localchat.serve.tool_fields import answer_format

MAX_GRAMMAR_CHARS = 256 * 1024  # a hand-written grammar is a few KB; llama.cpp parses it per turn


def answer_shape(body: dict[str, Any]) -> AnswerFormat | None:
    """The shape ``body`` asks for (None: free text); BadRequest naming the field."""
    grammar = field_of(body, "grammar", str) or None
    schema = field_of(body, "json_schema", dict)
    asked = [name for name, value in (("response_format", _shaped(body)), ("grammar", grammar),
                                      ("json_schema", schema)) if value is not None]
    if len(asked) > 1:
        raise bad(asked[1], f"cannot be given with {asked[0]}: a reply takes one shape")
    if grammar is not None:
        return _grammar(grammar)
    if schema is not None:
        return answer_format(schema, "json_schema")  # the schema itself, as Ollama's format
    return answer_format(field_of(body, "response_format", dict), "response_format")


def _shaped(body: dict[str, Any]) -> dict[str, Any] | None:
    """``response_format`` when it asks for a shape (``text`` asks for none)."""
    value = field_of(body, "response_format", dict)
    return None if value is None or value.get("type") == "text" else value


def _grammar(text: str) -> AnswerFormat:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise bad("grammar", f"may be at most {MAX_GRAMMAR_CHARS:,} characters, not {len(text):,}")
    from localchat.engine.sampling.grammar import check_grammar

    try:
        shape = grammar_format(text, "(request)")
        check_grammar(text)
    except FormatError as exc:
        raise BadRequest(f"grammar: {exc}", "grammar") from None
    return shape
