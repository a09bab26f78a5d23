"""Which of a reply's tool calls go back to the client as calls: only a call a client can run as
it stands. A small model asked to call tools sometimes echoes the tools' description instead
(``{"name": "get_weather", "parameters": {"type": "object", ...}}``), which the lenient reader
takes for a call whose arguments are the schema itself; a client would run the tool with
made-up arguments. So a call is passed on only when it was read whole, names a tool the request
offered, and its arguments are valid under that tool's ``parameters`` (``formats.validate``);
any other is text of the answer, as the model wrote it but without the call's markers
(``<tool_call>``, ``[TOOL_CALLS]``: a client would show them as they are).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from localchat.formats.validate import arguments_problem
from localchat.reply.call_openers import without_markers
from localchat.reply.calls import ToolCall


def checked_calls(calls: Iterable[ToolCall], tools: Iterable[dict[str, Any]]
                  ) -> tuple[tuple[ToolCall, ...], str]:
    """(the calls for the client, the text of the others without their markers, one per
    paragraph)."""
    schemas = {tool["function"]["name"]: tool["function"].get("parameters") or {}
               for tool in tools}
    kept, text = [], []
    for call in calls:
        if (call.runnable and call.name in schemas
                and arguments_problem(schemas[call.name], call.arguments) is None):
            kept.append(call)
        elif shown := without_markers(call.raw):
            text.append(shown)
    return tuple(kept), "\n\n".join(text)
