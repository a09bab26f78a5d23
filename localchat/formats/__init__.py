"""Answers in a shape: what a user may ask an answer to be (any JSON object, a JSON Schema, or a
GBNF grammar), the grammar that enforces it while sampling, and the check of the finished answer.

:class:`AnswerFormat` is what ``ask --format/--schema/--grammar``, the app's ``/format`` and the
remote route share. Building one (``json_format``, ``schema_format``, ``grammar_format``) turns a
JSON Schema into its grammar (``formats.json_schema``) and refuses what cannot be enforced with a
FormatError, before any model loads; whether a GBNF text parses is for llama.cpp to say (the
engine's ``check_grammar``). ``read_schema`` takes what a user types after ``--schema``: JSON
Schema text, a file holding one, or llm's short form (``formats.short_form``); ``read_grammar``
the file named after ``--grammar``.

Beside it: ``formats.constraint`` (a grammar a reply must follow while sampled, lazy or not, and
where in the reply it applies) and ``formats.tool_grammar`` (a tool call's grammar, from the
tools' schemas and the family's description in ``reply.families``).

Plain logic without a model: the engine only ever sees the grammar text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from localchat.errors import FormatError, UserError
from localchat.formats.gbnf import Rules
from localchat.formats.json_schema import schema_grammar
from localchat.formats.short_form import multi_schema, short_form_schema
from localchat.formats.validate import schema_problem
from localchat.user_files import UnreadableFile, read_user_file

FormatKind = Literal["json", "schema", "grammar"]


@dataclass(frozen=True)
class AnswerFormat:
    """The shape asked of an answer. ``grammar`` is the GBNF that enforces it (root rule
    ``root``); ``schema`` the JSON Schema answers are checked against (kind "schema");
    ``name`` how it is shown ("json", "schema {name, age}", "grammar list.gbnf")."""

    kind: FormatKind
    grammar: str
    name: str
    schema: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def is_json(self) -> bool:
        """Whether answers are JSON (shown as a JSON block, checked by parsing)."""
        return self.kind != "grammar"

    def problem(self, answer: str) -> str | None:
        """None when a finished ``answer`` has the shape asked; else one line saying why not.
        A grammar's answers are whole when the grammar let the reply end: there is nothing to
        check afterwards."""
        if not self.is_json:
            return None
        try:
            value = json.loads(answer)
            if self.schema is None:
                return None if isinstance(value, dict) else "the answer is not a JSON object"
            found = schema_problem(value, self.schema)
        except ValueError as exc:
            return f"the answer is not JSON ({exc})"
        except RecursionError:
            return "the answer nests too deeply to be checked"
        return None if found is None else f"the answer does not match the schema: {found}"

    def verdict(self, answer: str, finish_reason: str) -> str | None:
        """None when a reply that ended with ``finish_reason`` ("stop", "length", "aborted")
        holds an answer of this shape; else why not, in one line (a reply cut in the middle is
        incomplete, whatever it holds)."""
        what = "the JSON" if self.is_json else "what the grammar asks for"
        if finish_reason == "length":
            return (f"the answer is incomplete: the reply reached its token limit before {what} "
                    "was complete")
        if finish_reason == "aborted":
            return f"the answer is incomplete: the reply was stopped before {what} was complete"
        return self.problem(answer)

    def response_format(self) -> dict[str, Any]:
        """The OpenAI ``response_format`` that asks a remote model for this shape (a grammar
        has none: such a turn stays local)."""
        if self.schema is None:
            return {"type": "json_object"}
        return {"type": "json_schema",
                "json_schema": {"name": "answer", "schema": self.schema, "strict": False}}


def json_format() -> AnswerFormat:
    """Any JSON object (``--format json``, Ollama's ``format: "json"``)."""
    rules = Rules()
    root = rules.reserve("root")
    rules.define(root, rules.primitive("object"))
    return AnswerFormat("json", rules.text(), "json")


def schema_format(schema: Any, name: str = "") -> AnswerFormat:
    """A JSON Schema (already parsed) as an answer format; FormatError if it cannot be enforced."""
    grammar = schema_grammar(schema)
    return AnswerFormat("schema", grammar, name or f"schema {describe(schema)}", schema)


def grammar_format(text: str, name: str) -> AnswerFormat:
    """A GBNF grammar (its root rule ``root``) as an answer format. Only its emptiness is
    checked here; llama.cpp's parser judges the rest (``engine.sampling.grammar.check_grammar``)."""
    if not text.strip():
        raise FormatError(f"the grammar {name} is empty")
    return AnswerFormat("grammar", text, f"grammar {name}")


def read_grammar(path_text: str) -> AnswerFormat:
    """The GBNF grammar in the file ``path_text`` as an answer format (``--grammar``, ``/format
    FILE.gbnf``); FormatError when it cannot be read. Whether llama.cpp parses it is the
    engine's ``check_grammar``'s to say."""
    path = Path(path_text).expanduser()
    try:
        text = read_user_file(path, "a grammar is text of a few KB").decode("utf-8")
    except (UserError, UnicodeDecodeError) as exc:
        reason = exc.reason if isinstance(exc, UnreadableFile) else exc
        raise FormatError(f"cannot read the grammar {path_text}: {reason}") from None
    return grammar_format(text, path.name)


def read_schema(text: str, multi: bool = False) -> dict[str, Any]:
    """What follows ``--schema`` or ``/format``: JSON Schema text, the path of a file holding
    one, or llm's short form ('name, age int, bio: one line'). ``multi``: a list of them, under
    the key ``items`` (``--schema-multi``)."""
    stripped = text.strip()
    if not stripped:
        raise FormatError("the schema is empty")
    if stripped.startswith("{"):
        schema = _parse_json(stripped, "the schema")
    elif (path := _schema_file(stripped)) is not None:
        try:
            content = read_user_file(path, "a schema is text of a few KB").decode("utf-8-sig")
        except (UserError, UnicodeDecodeError) as exc:
            reason = exc.reason if isinstance(exc, UnreadableFile) else exc
            raise FormatError(f"cannot read the schema file {stripped}: {reason}") from None
        schema = _parse_json(content, f"the schema file {stripped}")
        if not isinstance(schema, dict):
            raise FormatError(f"the schema file {stripped} does not hold a JSON object")
    else:
        return short_form_schema(stripped, multi)
    return multi_schema(schema) if multi else schema


def _schema_file(text: str) -> Path | None:
    """The file ``text`` names, if it names anything (a directory or a device too, which
    ``read_user_file`` then names as such); FormatError for what can only be a file name (a .json
    path) that is not there."""
    if "\n" in text or "," in text:
        return None
    path = Path(text).expanduser()
    if os.path.lexists(path):
        return path
    if text.endswith(".json") or "/" in text:
        raise FormatError(f"the schema file {text} does not exist")
    return None


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise FormatError(f"{what} nests too deeply") from None


def describe(schema: Any, depth: int = 0) -> str:
    """A short outline of a schema for the status bar: "{name, age, tags[]}"."""
    if not isinstance(schema, dict):
        return "any"
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties:
        if depth >= 1:
            return "{…}"
        names = [name + ("[]" if isinstance(sub, dict) and sub.get("type") == "array" else "")
                 for name, sub in properties.items()]
        shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        return "{" + shown + "}"
    kind = schema.get("type")
    if kind == "array":
        return describe(schema.get("items"), depth + 1) + "[]"
    return kind if isinstance(kind, str) else "any"
