"""Tools on the wire to an OpenAI-compatible remote: what is sent, and the calls that come back.

- :func:`tool_fields`: a turn's ``Sampling.tools`` / ``tool_choice`` as the request's ``tools``
  and ``tool_choice`` (a tool's name becomes ``{"type": "function", "function": {"name": ...}}``);
- :func:`wire_messages`: the history as the remote takes it: an assistant message that called
  tools carries OpenAI ``tool_calls`` and, as ``content``, only its text (a local model's call
  markup, kept in the history for the local cache, is taken out); a ``tool`` message has
  ``tool_call_id`` and ``content`` (no ``name``, which strict servers refuse);
- :class:`CallAssembler`: streamed ``delta.tool_calls`` entries (by ``index``: the id and name
  once, the arguments as string pieces) assembled into ``ToolCall``s when the reply ends. A
  call whose arguments are not a JSON object, or that names no tool, is still a call, with a
  ``problem`` the model is told about; the chat's tool rounds check the arguments against the
  tool's schema before anything runs (a remote may send anything).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from localchat.reply.call_stream import ToolCallSplitter
from localchat.reply.calls import ToolCall, mark_incomplete
from localchat.reply.families import FORMATS
from localchat.reply.reasoning import split_reply

MAX_ARGUMENT_CHARS = 1_000_000  # of one call's arguments: a remote that streams on is cut there
MODES = ("auto", "none", "required")


def tool_fields(tools: tuple[dict[str, Any], ...], tool_choice: str) -> dict[str, Any]:
    """The request's ``tools`` and ``tool_choice`` (nothing when the turn offers no tools)."""
    if not tools:
        return {}
    choice: Any = tool_choice if tool_choice in MODES else \
        {"type": "function", "function": {"name": tool_choice}}
    return {"tools": list(tools), "tool_choice": choice}


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as an OpenAI-compatible server takes them (see the module)."""
    out = []
    for message in messages:
        if message.get("role") == "tool":
            out.append({"role": "tool", "tool_call_id": message.get("tool_call_id", ""),
                        "content": message.get("content", "")})
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            out.append({"role": "assistant", "content": _text_only(message) or None,
                        "tool_calls": message["tool_calls"]})
        else:
            out.append(message)
    return out


def _text_only(message: dict[str, Any]) -> str:
    """An assistant message's text without the calls as a local model wrote them: the first
    family whose reading of the content finds exactly the listed calls decides."""
    content = message.get("content") or ""
    reasoning, answer = split_reply(content)
    text = answer if reasoning else content
    listed = [(c.name, c.arguments) for c in map(ToolCall.from_openai, message["tool_calls"])]
    for fmt in FORMATS.values():
        splitter = ToolCallSplitter(fmt)
        pieces = [*splitter.feed(text), *splitter.flush()]
        found = [(p.name, p.arguments) for p in pieces if isinstance(p, ToolCall)]
        if found == listed:
            return "".join(p for p in pieces if isinstance(p, str)).strip()
    return text.strip()


@dataclass
class _Pending:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0


class CallAssembler:
    """Streamed ``tool_calls`` deltas into calls (see the module)."""

    def __init__(self) -> None:
        self._calls: dict[int, _Pending] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, deltas: tuple[dict[str, Any], ...]) -> None:
        for position, delta in enumerate(deltas):
            index = delta.get("index", position)
            pending = self._calls.setdefault(index if isinstance(index, int) else position,
                                             _Pending())
            if isinstance(delta.get("id"), str) and delta["id"]:
                pending.id = delta["id"]
            function = delta.get("function")
            if not isinstance(function, dict):
                continue
            if isinstance(function.get("name"), str) and function["name"]:
                # Most servers send the name once; a few repeat it, or send it in pieces.
                name = function["name"]
                pending.name = name if not pending.name or name.startswith(pending.name) \
                    else pending.name + name
            piece = function.get("arguments")
            if isinstance(piece, dict):  # a server that sends the object itself
                piece = json.dumps(piece)
            if isinstance(piece, str) and pending.size < MAX_ARGUMENT_CHARS:
                pending.arguments.append(piece)
                pending.size += len(piece)

    def calls(self, *, complete: bool = True) -> tuple[ToolCall, ...]:
        """The calls so far, in index order; ``complete`` False: the reply was cut, so they are
        marked incomplete."""
        calls = []
        for _, pending in sorted(self._calls.items()):
            entry: dict[str, Any] = {"function": {"name": pending.name,
                                                  "arguments": "".join(pending.arguments)}}
            if pending.id:
                entry["id"] = pending.id
            call = ToolCall.from_openai(entry)
            if pending.size >= MAX_ARGUMENT_CHARS and call.runnable:
                call = ToolCall(call.id, call.name, {}, problem=f"the arguments of {call.name} "
                                f"passed {MAX_ARGUMENT_CHARS:,} characters", raw="")
            calls.append(call if complete else mark_incomplete(call))
        return tuple(calls)
