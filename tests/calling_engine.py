"""A scripted engine whose replies may call tools, for tests of the chat's tool loop.

``CallingEngine`` is ``tests.fake_engine.FakeEngine`` with one addition: a reply script that
writes Hermes-style calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) ends with
a ``Done`` whose ``tool_calls`` are those calls, as the real engine's does (``Done.reply`` keeps
the text as written). Its Tokens still carry the markup: the loop never looks at them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from localchat.events import Done
from localchat.reply.call_stream import ToolCallSplitter
from localchat.reply.calls import ToolCall
from localchat.reply.families import HERMES
from tests.fake_engine import FakeEngine


def call_text(name: str, **arguments: Any) -> str:
    """How the scripted model writes one call."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def calls_in(reply: str) -> tuple[ToolCall, ...]:
    splitter = ToolCallSplitter(HERMES)
    pieces = [*splitter.feed(reply), *splitter.flush()]
    return tuple(p for p in pieces if isinstance(p, ToolCall))


class CallingEngine(FakeEngine):
    def _turn(self, messages, handle, stop, background):  # type: ignore[override]
        final = super()._turn(messages, handle, stop, background)
        if isinstance(final, Done) and not background:
            return replace(final, tool_calls=calls_in(final.reply))
        return final
