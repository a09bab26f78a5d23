"""A request's tools, its messages with tool calls and results, and its answer shape, as both
APIs send them; and the memory that keeps a tool round exact in the cache.

- ``tools``: OpenAI's (and Ollama's) ``[{"type": "function", "function": {"name",
  "description", "parameters"}}]``; ``tool_choice`` "auto" | "none" | "required" | ``{"type":
  "function", "function": {"name": ...}}`` (OpenAI's). The server never runs a tool: the model's
  calls go back to the client, which sends the results in the next request.
- An assistant message's ``tool_calls``: OpenAI's ``{"id", "type", "function": {"name",
  "arguments": "<JSON text>"}}`` or Ollama's ``{"function": {"name", "arguments": {...}}}``
  (no id: one is made from the message's place, the same in every request of the
  conversation, so the prompt renders the same each time). A ``tool`` message answers the call
  named by its ``tool_call_id`` (OpenAI) or ``tool_name`` (Ollama), else the next one unanswered.
- ``response_format`` (OpenAI: ``json_object``, ``json_schema``; llama-server's ``json_object``
  with a ``schema``; other keys in it are ignored, as llama-server does) and ``format`` (Ollama:
  ``"json"`` or a JSON Schema): the reply is sampled under the shape's grammar (issue 39's
  ``localchat.formats``); a schema that cannot be enforced is a 400 naming the field, and so is
  one over ``formats.limits`` (checked before it is converted, a tool's parameters too) or one
  whose conversion runs past ``SCHEMA_LIMIT_S``. Requests are read off the event loop
  (``Exchange.read``), so a schema converting never holds up other clients.

:class:`RawCalls`: a client sends a call back as the API gave it (content without the call's
marker, arguments re-serialized), which the template would render otherwise than the model
wrote it, so the cache would be prefilled again from that reply on. The server remembers, per
reply that called tools, the content it sent and the calls, with the reply as written; a later
request whose assistant message has that same content and those calls gets the reply as written
back as its content, and the engine renders those exact tokens (``engine.tool_turn``).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from localchat.engine.deadline import DeadlineExceeded, within
from localchat.errors import FormatError
from localchat.formats import AnswerFormat, json_format, schema_format
from localchat.formats.limits import schema_size_problem
from localchat.reply.calls import ToolCall, nine_character_id
from localchat.serve.fields import field_of
from localchat.serve.http_errors import BadRequest, bad

MAX_TOOLS = 128
REMEMBERED = 1024  # replies with calls kept for exact rendering (a few KB each)
# A schema within formats.limits converts in well under a second; past this, it is refused.
SCHEMA_LIMIT_S = 5.0


def tools_of(body: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The request's ``tools``, checked (400 naming the field)."""
    value = field_of(body, "tools", list)
    if not value:
        return ()
    if len(value) > MAX_TOOLS:
        raise bad("tools", f"may hold at most {MAX_TOOLS} tools, not {len(value)}")
    tools = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]."
        if not isinstance(tool, dict):
            raise bad(f"tools[{i}]", "must be an object such as {\"type\": \"function\", ...}")
        if tool.get("type", "function") != "function":
            raise bad(where + "type", f"must be \"function\", not {json.dumps(tool.get('type'))}")
        function = field_of(tool, "function", dict, where)
        if function is None:
            raise bad(where + "function", "is missing")
        name = field_of(function, "name", str, where + "function.")
        if not name or not name.strip() or len(name) > 128:
            raise bad(where + "function.name", "must be a tool name of 1 to 128 characters")
        field_of(function, "description", str, where + "function.")
        parameters = field_of(function, "parameters", dict, where + "function.")
        entry: dict[str, Any] = {"name": name}
        if function.get("description"):
            entry["description"] = function["description"]
        if parameters is not None:
            if problem := schema_size_problem(parameters):
                raise bad(where + "function.parameters", problem)
            entry["parameters"] = parameters
        tools.append({"type": "function", "function": entry})
    return tuple(tools)


def tool_choice_of(body: dict[str, Any], tools: tuple[dict[str, Any], ...]) -> str:
    """``tool_choice`` as the engine takes it ("auto" | "none" | "required" | a tool's name)."""
    value = body.get("tool_choice")
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise bad("tool_choice", f"must be auto, none, required or a function, not {value!r}")
        choice = value
    elif isinstance(value, dict):
        name = field_of(field_of(value, "function", dict, "tool_choice.") or {}, "name", str,
                        "tool_choice.function.")
        if not name:
            raise bad("tool_choice.function.name", "is missing")
        choice = name
    else:
        raise bad("tool_choice", "must be a string or {\"type\": \"function\", ...}")
    names = [tool["function"]["name"] for tool in tools]
    if choice not in ("auto", "none") and not names:
        raise bad("tool_choice", f"is {choice!r} but the request offers no tools")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise bad("tool_choice", f"names {choice!r}, which is not among the tools "
                                 f"({', '.join(names)})")
    return choice


def calls_of(message: dict[str, Any], where: str, index: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as OpenAI entries (arguments as JSON text), each
    with an id (one made from ``index``, the message's place, when the client sent none)."""
    value = field_of(message, "tool_calls", list, where)
    entries = []
    for j, entry in enumerate(value or []):
        at = f"{where}tool_calls[{j}]"
        if not isinstance(entry, dict):
            raise bad(at, "must be an object such as {\"function\": {\"name\", \"arguments\"}}")
        function = field_of(entry, "function", dict, at + ".")
        if function is None:
            raise bad(at + ".function", "is missing")
        name = field_of(function, "name", str, at + ".function.")
        if not name:
            raise bad(at + ".function.name", "is missing")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise bad(at + ".function.arguments", "is not valid JSON") from None
        else:
            parsed = arguments
        if not isinstance(parsed, dict):
            raise bad(at + ".function.arguments", "must be a JSON object")
        call_id = field_of(entry, "id", str, at + ".") or nine_character_id(f"call-{index}-{j}")
        entries.append({"id": call_id, "type": "function", "function": {
            "name": name, "arguments": json.dumps(parsed, ensure_ascii=False)}})
    return entries


def tool_result(message: dict[str, Any], where: str, content: str,
                unanswered: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``tool`` message as the engine takes it, matched to the call it answers among
    ``unanswered`` (the last assistant message's calls not yet answered; the match is removed)."""
    call_id = field_of(message, "tool_call_id", str, where)
    name = field_of(message, "tool_name", str, where) or field_of(message, "name", str, where)
    match = next((c for c in unanswered if call_id and c["id"] == call_id), None)
    if match is None and not call_id:
        match = next((c for c in unanswered if not name or c["function"]["name"] == name), None)
    if match is not None:
        unanswered.remove(match)
        call_id, name = match["id"], name or match["function"]["name"]
    return {"role": "tool", "tool_call_id": call_id or "", "name": name or "", "content": content}


def answer_format(value: Any, param: str) -> AnswerFormat | None:
    """OpenAI's ``response_format`` or Ollama's ``format`` as an AnswerFormat (None: text)."""
    try:
        kind = value.get("type") if isinstance(value, dict) and param == "response_format" \
            else None
        if value is None or value == "" or kind == "text":
            return None
        if value == "json" or (kind == "json_object" and value.get("schema") is None):
            return json_format()
        if kind == "json_object":  # llama-server's: any object, or the one its schema gives
            if not isinstance(value["schema"], dict):
                raise bad(param + ".schema", "must be a JSON Schema object")
            return _converted(value["schema"], "")
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise bad(param + ".json_schema.schema", "must be a JSON Schema object")
            name = spec.get("name")
            return _converted(spec["schema"], name if isinstance(name, str) else "")
        if isinstance(value, dict) and "type" in value and param == "response_format":
            raise bad(param + ".type", "must be text, json_object or json_schema, not "
                                       f"{json.dumps(value.get('type'))}")
        if isinstance(value, dict):  # Ollama: the schema itself
            return _converted(value, "")
    except FormatError as exc:
        raise BadRequest(f"{param}: {exc}", param) from None
    raise bad(param, f"must be \"json\" or a JSON Schema object, not {json.dumps(value)[:40]}")


def _converted(schema: dict[str, Any], name: str) -> AnswerFormat:
    """``schema`` as an answer format, if it is within ``formats.limits`` and converts within
    ``SCHEMA_LIMIT_S`` (FormatError otherwise)."""
    if problem := schema_size_problem(schema):
        raise FormatError(problem)
    try:
        return within(SCHEMA_LIMIT_S, lambda: schema_format(schema, name))
    except DeadlineExceeded:
        raise FormatError(f"the schema took over {SCHEMA_LIMIT_S:g} s to turn into a grammar; "
                          "make it smaller or simpler") from None


class RawCalls:
    """Replies that called tools, as the model wrote them, found again by the content and calls
    a client sends back (see the module). Thread-safe enough: used on the event loop only."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self._limit = limit
        self._replies: OrderedDict[str, str] = OrderedDict()

    def remember(self, content: str, calls: tuple[ToolCall, ...], reply: str) -> None:
        if not calls:
            return
        key = _key(content, [(c.name, c.arguments) for c in calls])
        self._replies[key] = reply
        self._replies.move_to_end(key)
        while len(self._replies) > self._limit:
            self._replies.popitem(last=False)

    def restore(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with each remembered reply's content as the model wrote it."""
        out = []
        for message in messages:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                calls = [ToolCall.from_openai(e) for e in message["tool_calls"]]
                reply = self._replies.get(_key(message.get("content") or "",
                                               [(c.name, c.arguments) for c in calls]))
                if reply is not None:
                    message = {**message, "content": reply}
            out.append(message)
        return out


def _key(content: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    text = json.dumps([content.strip(), calls], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
