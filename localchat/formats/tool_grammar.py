"""The grammar of a tool call: from the family's marker on, the reply may only write a call to
one of the tools offered, its arguments in the shape of that tool's ``parameters`` schema.

As llama.cpp's server does (``common/chat.cpp``), the grammar is lazy for ``tool_choice``
"auto": the answer is free until the family's marker (``<tool_call>``, ``<|python_tag|>``,
``[TOOL_CALLS]``) or, for the families whose calls may open the reply without one, a call object
naming a tool at the reply's start (``reply.families.bare_call_pattern``); from there the call is
constrained, and once it is complete only the end of the reply may follow (the reply stops on
the call's end). One call per reply, as llama.cpp's server does by default
(``parallel_tool_calls`` false): a small model allowed another after the first repeats it until
the token limit; the loop gives it the result and the next reply may call again. For "required"
or a tool's name the grammar applies from the answer's first token, so even a small model calls.
"none" has no grammar (and no tools shown).

Each family's calls are written as its models write them and as ``reply.call_stream`` reads them,
from the pieces of its ``reply.families`` entry:

- hermes and generic: ``<tool_call>`` ``{"name": ..., "arguments": {...}}`` ``</tool_call>``,
  one block per call (a bare object may open an "auto" reply);
- llama3: ``{"name": ..., "parameters": {...}}``, after ``<|python_tag|>`` or opening the reply;
- mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcdef123"}]``, or
  ``[TOOL_CALLS]name[ARGS]{...}`` for templates that show calls that way.

A tool whose schema cannot be enforced (a keyword the converter refuses) takes any JSON object:
the call is still read, and its arguments checked when it runs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localchat.errors import FormatError
from localchat.formats.constraint import Constraint
from localchat.formats.gbnf import Rules, alternatives, literal
from localchat.formats.json_schema import schema_grammar, schema_rule
from localchat.reply.families import ToolFormat, bare_call_pattern

_ID = '"\\"" [a-zA-Z0-9]{9} "\\""'  # Mistral's 9-character call ids


def tool_name(tool: dict[str, Any]) -> str:
    """The name of an OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``, or
    the function object itself)."""
    function = tool.get("function", tool)
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def tool_names(tools: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(name for name in (tool_name(tool) for tool in tools) if name)


def chosen_tools(tools: tuple[dict[str, Any], ...], choice: str) -> list[dict[str, Any]]:
    """The tools a call may name under ``choice`` ("auto", "required" or a tool's name);
    FormatError for a name that is not among them."""
    if choice in ("auto", "required"):
        return [tool for tool in tools if tool_name(tool)]
    chosen = [tool for tool in tools if tool_name(tool) == choice]
    if not chosen:
        offered = ", ".join(tool_names(tools)) or "none"
        raise FormatError(f"tool_choice names {choice!r}, which is not among the tools offered "
                          f"({offered})")
    return chosen


def call_constraint(fmt: ToolFormat, tools: tuple[dict[str, Any], ...], choice: str,
                    template: str = "") -> Constraint | None:
    """The constraint for a turn offering ``tools`` under ``choice`` (see the module); None for
    "none" or no tools. ``template``: the chat template (Mistral's named form is read from it)."""
    if choice == "none" or not tools:
        return None
    chosen = chosen_tools(tools, choice)
    if not chosen:
        return None
    lazy = choice == "auto"
    rules = Rules()
    root = rules.reserve("root")
    ws = rules.primitive("ws")
    named = fmt.named_form(template)
    calls = [_call(rules, fmt, tool, named) for tool in chosen]
    call = rules.add("call", alternatives(calls))
    body = (fmt.named_grammar if named else fmt.grammar).format(ws=ws, call=call)
    if lazy and fmt.bare_call_in_grammar:
        body = f"( {body} | {call} )"
    rules.define(root, body)
    if not lazy:
        return Constraint(rules.text())
    patterns = [re.escape(fmt.marker)]
    if fmt.bare_start:  # only the tools' names: the grammar refuses any other
        patterns.append("^" + bare_call_pattern(tool_names(chosen)))
    return Constraint(rules.text(), trigger_patterns=tuple(patterns))


def _call(rules: Rules, fmt: ToolFormat, tool: dict[str, Any], named: bool) -> str:
    """The rule for one call to ``tool`` in ``fmt``'s words (``named``: its named form)."""
    name = tool_name(tool)
    args = _arguments(rules, tool, name)
    if named:
        return rules.add(f"call-{name}", f"{literal(name)} {literal(fmt.named_sign)} {args}")
    ws = rules.primitive("ws")
    head = f'"{{" {ws} '
    if fmt.type_first:
        head += f'( "\\"type\\"" {ws} ":" {ws} "\\"function\\"" {ws} "," {ws} )? '
    body = (f'{head}"\\"name\\"" {ws} ":" {ws} {literal(json.dumps(name, ensure_ascii=False))} '
            f'{ws} "," {ws} {literal(json.dumps(fmt.arguments_key))} {ws} ":" {ws} {args}')
    if fmt.nine_character_ids:
        body += f' ( {ws} "," {ws} "\\"id\\"" {ws} ":" {ws} {_ID} )?'
    return rules.add(f"call-{name}", f'{body} {ws} "}}"')


def _arguments(rules: Rules, tool: dict[str, Any], name: str) -> str:
    function = tool.get("function", tool)
    schema = function.get("parameters") if isinstance(function, dict) else None
    if not isinstance(schema, dict) or not schema:
        schema = {"type": "object"}
    try:
        schema_grammar(schema)  # first on its own: a refusal must leave no rule half made
    except FormatError:
        return rules.primitive("object")
    return schema_rule(schema, rules, f"{name}-arguments")
