"""The model families that call tools, in one table: how each writes a call, and everything the
parser, the lazy grammar and the chat templates need to know about it.

One family per description, as llama.cpp's ``common/chat-parsers/`` keeps one per file: the
preserved tokens, the lazy grammar's trigger, the grammar's pieces and the parser's openings all
come from the same :class:`ToolFormat`, so the grammar that constrains a call and the reader
that reads it cannot disagree. Nothing else asks which family it is looking at by name.

The families, in the order :func:`detect_format` tries them (llama.cpp's ``common/chat.cpp``
order):

- ``hermes`` (Hermes 2/3, Qwen 2.5/3, and most ChatML fine-tunes): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>``, with the variants llama.cpp accepts (``<function=NAME>{...}
  </function>``, other wrapper tags and code fences around a ``{"name"`` object);
- ``llama3`` (Llama 3.1-3.3): the reply is ``{"name": ..., "parameters": {...}}`` (after optional
  whitespace), or ``<|python_tag|>`` then such an object or a builtin's ``name.call(k=v)``;
- ``mistral`` (Mistral 7B v0.3, Nemo, Small): ``[TOOL_CALLS][{"name": ..., "arguments": {...},
  "id": "abcdef123"}]``, or the newer ``[TOOL_CALLS]name[ARGS]{...}``;
- ``generic``: templates that know nothing of tools. ``engine.tool_templates`` then describes the
  tools in the system prompt and asks for the hermes form, which is what this family reads (and,
  at the start of a reply, a bare call object or llama.cpp's ``{"tool_call": ...}`` envelope).

``triggers`` are the words from which a call begins anywhere in a reply (the first, ``marker``,
is where the lazy grammar begins), and :func:`start_trigger` the pattern of a call object that
opens the reply without a marker: where constrained sampling switches its lazy grammar on
(llama.cpp's trigger words and full-match patterns). ``preserved_tokens`` are the special tokens
that must be detokenized as text for the parser to see them (``<|python_tag|>`` and
``[TOOL_CALLS]`` are special tokens, which llama.cpp renders as nothing by default).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from localchat.reply.call_openers import (
    BODY,
    ENVELOPE_KEY,
    WS,
    Opener,
    array_head,
    call_head,
    hermes_openers,
)

FormatName = Literal["hermes", "llama3", "mistral", "generic"]

# How calls open in a family's replies, given the names of the tools offered.
Openers = Callable[[tuple[str, ...]], tuple[Opener, ...]]


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes calls (see the module docstring)."""

    name: FormatName
    triggers: tuple[str, ...]
    openers: Openers  # (``reply.call_openers`` matches them)
    # The grammar of a reply's calls from the marker on (``formats.tool_grammar``), in GBNF:
    # {ws} and {call} stand for the rules of whitespace and of one call to a tool offered.
    grammar: str
    preserved_tokens: tuple[str, ...] = ()
    # Words that must all be in a chat template of this family (none: any template).
    template_signs: tuple[str, ...] = ()
    # A call object may also open the reply without a marker ({"name": ...} after whitespace).
    bare_start: bool = False
    # Such an object may name any tool (Llama 3's small models invent names, as llama.cpp
    # allows); otherwise only the tools offered tell a call from a JSON answer.
    any_name_at_start: bool = False
    # Whether the lazy grammar takes that bare object as an alternative to the marked block
    # (a family whose block makes its marker optional already does not need it).
    bare_call_in_grammar: bool = False
    arguments_key: str = "arguments"
    # Llama 3.2 writes "type": "function" before the name.
    type_first: bool = False
    # Its templates refuse call ids that are not 9 letters and digits, and its replies may
    # write such an id after the arguments.
    nine_character_ids: bool = False
    # The word between a tool's name and its arguments in the named form (``name[ARGS]{...}``),
    # used when the chat template shows it, with the grammar of that block.
    named_sign: str = ""
    named_grammar: str = ""
    # Whether its templates show tools at all (the generic family's do not: the tools are
    # described in the system prompt instead).
    template_shows_tools: bool = True

    @property
    def marker(self) -> str:
        """The word a marked call begins with, from which the lazy grammar applies."""
        return self.triggers[0]

    def named_form(self, template: str) -> bool:
        """Whether ``template`` shows this family's calls in the named form."""
        return bool(self.named_sign) and self.named_sign in template

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"


def _generic_openers(names: tuple[str, ...]) -> tuple[Opener, ...]:
    return (*hermes_openers(names), Opener((BODY, "{", WS, ENVELOPE_KEY), at_start_only=True),
            Opener(array_head(call_head(names)), at_start_only=True))


def _llama3_openers(names: tuple[str, ...]) -> tuple[Opener, ...]:
    any_head = call_head(())  # its whole reply is the call object: any name opens it
    return (Opener(("<|python_tag|>", WS, BODY), body="python"),
            Opener(any_head, at_start_only=True),
            Opener(array_head(any_head), at_start_only=True))


def _mistral_openers(names: tuple[str, ...]) -> tuple[Opener, ...]:
    return (Opener(("[TOOL_CALLS]", WS, BODY), body="mistral"),
            Opener(array_head(call_head(names)), at_start_only=True))


_HERMES_BLOCK = '"<tool_call>" {ws} {call} {ws} "</tool_call>"'

HERMES = ToolFormat("hermes", triggers=("<tool_call>", "<function="), openers=hermes_openers,
                    grammar=_HERMES_BLOCK, template_signs=("<tool_call>",), bare_start=True,
                    bare_call_in_grammar=True)
LLAMA3 = ToolFormat("llama3", triggers=("<|python_tag|>",), openers=_llama3_openers,
                    grammar='( "<|python_tag|>" {ws} )? {call}',
                    preserved_tokens=("<|python_tag|>",),
                    template_signs=("<|start_header_id|>", "ipython"), bare_start=True,
                    any_name_at_start=True, arguments_key="parameters", type_first=True)
MISTRAL = ToolFormat("mistral", triggers=("[TOOL_CALLS]",), openers=_mistral_openers,
                     grammar='"[TOOL_CALLS]" "[" {ws} {call} {ws} "]"',
                     preserved_tokens=("[TOOL_CALLS]",), template_signs=("[TOOL_CALLS]",),
                     nine_character_ids=True, named_sign="[ARGS]",
                     named_grammar='"[TOOL_CALLS]" {call}')
GENERIC = ToolFormat("generic", triggers=("<tool_call>",), openers=_generic_openers,
                     grammar=_HERMES_BLOCK, bare_start=True, bare_call_in_grammar=True,
                     template_shows_tools=False)
# In the order detect_format tries them: the generic family, which needs no sign, last.
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, LLAMA3, MISTRAL, GENERIC)}


def detect_format(template: str) -> ToolFormat:
    """The family whose calls this chat template describes (llama.cpp's order of tests), or
    ``generic`` for a template that does not speak of tools."""
    return next(f for f in FORMATS.values() if all(sign in template for sign in f.template_signs))


def start_trigger(fmt: ToolFormat, tool_names: tuple[str, ...]) -> str | None:
    """The pattern of a reply that opens with a call object in ``fmt``'s replies (see
    :func:`bare_call_pattern`): any name where the family allows it, the tools' names
    otherwise. None for families whose calls always start with a marker."""
    if not fmt.bare_start:
        return None
    return bare_call_pattern(() if fmt.any_name_at_start else tool_names)


def bare_call_pattern(tool_names: tuple[str, ...]) -> str:
    """A regex that matches a reply opening with a call object, ``{"name": "<a tool>"`` after
    whitespace (and Llama's optional ``"type": "function",``), for a lazy grammar's full-match
    trigger: one of ``tool_names``, or any name when there are none."""
    names = ".*?" if not tool_names else \
        "(?:" + "|".join(re.escape(name) for name in tool_names) + ")"
    return (r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"' + names
            + r'"[\s\S]*')
