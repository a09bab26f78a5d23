"""``ask``'s answer-shape flags (``--format``, ``--schema``, ``--schema-multi``, ``--grammar``)
and the verdict on a shaped answer.

A shaped answer is complete when the reply ended by itself (the grammar let it end) and, for
JSON, when it parses and has the schema's shape. Anything else, a reply cut by the token limit or
a stop in the middle of the JSON, an answer breaking a keyword only checked afterwards, is not
the answer: ``ask`` says why on stderr with the text it got, and exits 1 (130 for Ctrl+C).
"""

from __future__ import annotations

import argparse

from localchat.errors import FormatError
from localchat.events import Done
from localchat.formats import AnswerFormat, json_format, read_grammar, read_schema, schema_format


def add_flags(parser: argparse.ArgumentParser) -> None:
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--format", metavar="json|SCHEMA",
                       help="answer with any JSON object ('json', as Ollama's format), or with JSON "
                       "matching a JSON Schema given inline")
    shape.add_argument("--schema", metavar="SCHEMA",
                       help="answer with JSON matching a JSON Schema: the schema's text, a file "
                       "holding it, or llm's short form ('name, age int, bio: one line')")
    shape.add_argument("--schema-multi", metavar="SCHEMA",
                       help="like --schema, for a list of such objects: {\"items\": [...]}")
    shape.add_argument("--grammar", metavar="FILE.gbnf",
                       help="answer in the shape of a GBNF grammar (llama.cpp's, start rule root)")


def answer_format(args: argparse.Namespace) -> AnswerFormat | None:
    """The shape the flags ask for (None: none); FormatError for one that cannot be used.
    Checked before any model loads."""
    if args.format is not None:
        text = args.format.strip()
        if text == "json":
            return json_format()
        if text.startswith("{"):
            return schema_format(read_schema(text))
        raise FormatError(f"--format takes 'json' or a JSON Schema, not {text[:40]!r}")
    if args.schema is not None:
        return schema_format(read_schema(args.schema))
    if args.schema_multi is not None:
        return schema_format(read_schema(args.schema_multi, multi=True))
    if args.grammar is not None:
        from localchat.engine.sampling.grammar import check_grammar

        shape = read_grammar(args.grammar)
        check_grammar(shape.grammar)
        return shape
    return None


def verdict(answer_format: AnswerFormat, done: Done) -> str | None:
    """None when ``done`` holds an answer in ``answer_format``; else why not, in one line."""
    return answer_format.verdict(done.answer, done.finish_reason)
