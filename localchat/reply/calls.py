"""Tool calls: the words every layer shares (a call, its result, its id).

:class:`ToolCall` is one call the model asked for (an id, the tool's name, its arguments as a JSON
object) and :class:`ToolResult` what goes back to the model for it; the MCP clients and built-in
tools (``localchat.tools``), the chat templates (``engine.tool_templates``) and the front ends all
speak these two. A call that cannot run as written (its JSON unreadable, no name, cut off by
``max_tokens``) is still a ToolCall, with ``problem`` saying why: the model is told, the
conversation goes on.

How each model family writes calls in its reply, and how it is found from a chat template, is
``reply.families``; the streaming parser is ``reply.call_stream``.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from localchat.reply import lenient_json

_ID_ALPHABET = string.ascii_letters + string.digits
# Mistral's templates refuse ids that are not 9 letters and digits; every id here is one.
_ID = re.compile(r"[A-Za-z0-9]{9}")


def new_call_id() -> str:
    """A fresh call id: 9 letters and digits (what Mistral's templates require, fine for all)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


def nine_character_id(call_id: str) -> str:
    """``call_id`` itself if it is 9 letters and digits, else 9 derived from it, always the same
    (a remote model's ``call_abc...`` ids, rendered for a Mistral template)."""
    if _ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8")).digest()
    return "".join(_ID_ALPHABET[b % len(_ID_ALPHABET)] for b in digest[:9])


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for.

    ``arguments`` is always a JSON object (a dict). ``problem`` is empty for a call that can be
    run; otherwise it says, for the model, why this one cannot (``incomplete`` when the reply
    ended inside it). ``raw`` is the call exactly as the model wrote it, markers included.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    problem: str = ""
    incomplete: bool = False
    raw: str = ""

    @property
    def runnable(self) -> bool:
        return not self.problem

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` entry (arguments as a JSON string)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_json()}}

    @classmethod
    def from_openai(cls, entry: dict[str, Any]) -> ToolCall:
        """A call from an OpenAI ``tool_calls`` entry (a remote model's, or one stored), keeping
        its id whatever its form."""
        call = call_from_object(entry)
        given = entry.get("id")
        if isinstance(given, str) and given:
            call = ToolCall(given, call.name, call.arguments, call.problem, call.incomplete,
                            call.raw)
        return call

    def __repr__(self) -> str:
        extra = f" problem={self.problem!r}" if self.problem else ""
        return f"<ToolCall {self.id} {self.name}({self.arguments_json()[:60]}){extra}>"


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model for one call, and the one-line notice the user sees.

    ``content`` is text the model reads (inert for a terminal, capped in size); ``is_error`` marks
    a failure the model should know about (a denial, a timeout, a tool that does not exist).
    ``notice`` is empty when there is nothing to tell the user beyond the result itself.
    """

    call_id: str
    name: str
    content: str
    is_error: bool = False
    notice: str = ""

    def to_message(self) -> dict[str, Any]:
        """The ``tool`` role message that carries this result into the conversation."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name,
                "content": self.content}


def failed_call_result(call: ToolCall) -> ToolResult:
    """The result a call that cannot run gets: its problem, for the model to correct."""
    return ToolResult(call.id, call.name, f"error: {call.problem}", is_error=True,
                      notice=f"{call.name or 'a tool call'}: {call.problem}")


def assistant_message(content: str, calls: list[ToolCall]) -> dict[str, Any]:
    """The assistant message of a reply that called tools, as templates and OpenAI expect."""
    return {"role": "assistant", "content": content, "tool_calls": [c.to_openai() for c in calls]}


def call_from_object(value: Any, *, default_id: str = "", raw: str = "") -> ToolCall:
    """A ToolCall from the JSON a model wrote for one call, in any of the shapes families use:
    ``{"name", "arguments"}``, ``{"name", "parameters"}``, ``{"type": "function", ...}``, OpenAI's
    ``{"id", "function": {"name", "arguments"}}``, with arguments as an object or a JSON string.
    A shape that names no tool gives a call with a ``problem``."""
    call_id = default_id if _ID.fullmatch(default_id or "") else new_call_id()
    if not isinstance(value, dict):
        return ToolCall(call_id, "", problem="the tool call is not a JSON object", raw=raw)
    if isinstance(value.get("id"), str) and _ID.fullmatch(value["id"]):
        call_id = value["id"]
    if isinstance(value.get("function"), dict):  # OpenAI's nesting
        value = {**value["function"], **{k: v for k, v in value.items() if k != "function"}}
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCall(call_id, "", problem="the tool call does not name a tool", raw=raw)
    arguments = value.get("arguments", value.get("parameters", {}))
    return _with_arguments(ToolCall(call_id, name.strip(), raw=raw), arguments)


def _with_arguments(call: ToolCall, arguments: Any) -> ToolCall:
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):  # a JSON string, as OpenAI sends and Mistral models write
        if not arguments.strip():
            arguments = {}
        else:
            try:
                arguments, _complete = lenient_json.parse(arguments)
            except ValueError as exc:
                return _problem(call, f"the arguments of {call.name} are not JSON ({exc})")
    if not isinstance(arguments, dict):
        return _problem(call, f"the arguments of {call.name} must be a JSON object")
    return ToolCall(call.id, call.name, arguments, raw=call.raw)


def _problem(call: ToolCall, problem: str) -> ToolCall:
    return ToolCall(call.id, call.name, call.arguments, problem=problem, raw=call.raw)


def calls_from_json(text: str, *, raw: str = "") -> list[ToolCall]:
    """The calls in one JSON value a model wrote: an object, an array of them, or llama.cpp's
    ``{"tool_call": {...}}`` / ``{"tool_calls": [...]}`` envelope. A value cut short (the reply
    ended) gives calls marked incomplete; unreadable JSON gives one call with a problem."""
    try:
        value, complete = lenient_json.parse(text)
    except ValueError as exc:
        return [ToolCall(new_call_id(), "", problem=f"the tool call is not valid JSON ({exc})",
                         raw=raw)]
    if isinstance(value, dict) and "name" not in value:
        if isinstance(value.get("tool_calls"), list):
            value = value["tool_calls"]
        elif "tool_call" in value:
            value = value["tool_call"]
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item, raw=raw if len(items) == 1 else "") for item in items]
    if not calls:
        return [ToolCall(new_call_id(), "", problem="the tool call list is empty", raw=raw)]
    if not complete:
        calls = [mark_incomplete(call) for call in calls]
    return calls


def mark_incomplete(call: ToolCall) -> ToolCall:
    """``call`` marked as cut off by the end of the reply (it must not run: its arguments may be
    missing their end)."""
    what = f"the call to {call.name}" if call.name else "the tool call"
    return ToolCall(call.id, call.name, call.arguments, incomplete=True, raw=call.raw,
                    problem=f"{what} was cut off before it was complete (the reply reached its "
                            "token limit)")


def render_call_text(call: ToolCall) -> str:
    """A call written in the hermes form (the generic prompt's, and llama.cpp's): what the model
    is shown of its own earlier calls where its template cannot render them."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"
