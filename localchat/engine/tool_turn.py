"""A turn with tools: how its prompt is rendered, how its reply is constrained and split.

A turn needs this when its Sampling offers tools or its history holds calls and results
(``reply.calls.assistant_message`` and ``ToolResult.to_message``, OpenAI's shape). :func:`plan`
gives:

- the renderer: the model's own template with the tools (``engine.tool_templates.with_tools``;
  the generic prompt for a template that knows none; what the template supports probed once per
  model by the engine); ``tool_choice`` "none" shows no tools (no call can come);
- the messages as rendered: an assistant message whose ``content`` is the reply as the model
  wrote it, calls and markers included (``Done.reply``), renders that text as it stands rather
  than its ``tool_calls`` through the template: the prompt then holds exactly the tokens the
  model sampled, so the next turn reuses every cell up to the result (a template's own rendering
  of a call rarely writes it byte for byte as the model did); content without the calls (an API
  client's history) renders the calls through the template;
- the lazy call grammar from the tools' schemas (``formats.tool_grammar``), unless the turn has
  its own answer format (then that shape wins and calls are only read);
- a ``ToolCallSplitter`` for the reply's answer: Token events carry the answer without the
  markers and the call JSON, and ``Done.tool_calls`` the calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat.engine.options import Sampling
from localchat.engine.templates import Render
from localchat.engine.tool_templates import ToolRendering, with_tools
from localchat.errors import EngineError
from localchat.formats.constraint import Constraint
from localchat.formats.tool_grammar import call_constraint, tool_names
from localchat.reply.call_stream import ToolCallSplitter
from localchat.reply.calls import ToolCall
from localchat.reply.families import ToolFormat
from localchat.reply.reasoning import split_reply


@dataclass(frozen=True)
class ToolPlan:
    """How one turn renders, constrains and splits (see the module)."""

    render: Render
    messages: list[dict]
    constraint: Constraint | None = None
    format: ToolFormat | None = None  # None: no calls are read from this reply
    names: tuple[str, ...] = ()

    def splitter(self) -> ToolCallSplitter | None:
        return ToolCallSplitter(self.format, self.names) if self.format is not None else None


def has_tool_messages(messages: list[dict]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def needs_plan(messages: list[dict], sampling: Sampling | None) -> bool:
    """Whether a turn for ``messages`` must be rendered through a plan."""
    return bool(sampling is not None and sampling.tools) or has_tool_messages(messages)


def plan(render: Render, rendering: ToolRendering, template: str, messages: list[dict],
         sampling: Sampling | None) -> ToolPlan:
    """The turn's plan. FormatError for a ``tool_choice`` that names a tool not offered."""
    offered = tuple(sampling.tools) if sampling is not None else ()
    choice = sampling.tool_choice if sampling is not None else "auto"
    shown = [] if choice == "none" else list(offered)
    tool_render = with_tools(render, rendering, shown)
    as_written = [_as_written(m, rendering.format) for m in messages]
    if as_written != messages and not _renders(tool_render, as_written):
        as_written = messages  # the template refuses results after a plain reply: its own way
    if not shown:
        return ToolPlan(tool_render, as_written)
    constraint = None
    if sampling is not None and sampling.constraint is None:
        constraint = call_constraint(rendering.format, offered, choice, template)
    return ToolPlan(tool_render, as_written, constraint, rendering.format, tool_names(offered))


def plain_render(render: Render, rendering: Callable[[], ToolRendering],
                 messages: list[dict]) -> tuple[Render, list[dict]]:
    """The renderer and messages for a prompt without tools offered (a background turn, the
    oracle's fresh prompt): the history's calls and results shaped for the template."""
    if not has_tool_messages(messages):
        return render, messages
    shaped = plan(render, rendering(), "", messages, None)
    return shaped.render, shaped.messages


def _as_written(message: dict, fmt: ToolFormat) -> dict:
    """``message`` without its ``tool_calls`` when its content already holds them as the model
    wrote them (the same calls, in order), so that the template renders that text."""
    entries = message.get("tool_calls")
    content = message.get("content")
    if message.get("role") != "assistant" or not entries or not isinstance(content, str):
        return message
    reasoning, answer = split_reply(content)
    splitter = ToolCallSplitter(fmt)
    pieces = [*splitter.feed(answer if reasoning else content), *splitter.flush()]
    found = [(p.name, p.arguments) for p in pieces if isinstance(p, ToolCall)]
    try:
        listed = [(c.name, c.arguments) for c in map(ToolCall.from_openai, entries)]
    except (AttributeError, TypeError):
        return message
    if not found or found != listed:
        return message
    return {k: v for k, v in message.items() if k != "tool_calls"}


def _renders(render: Render, messages: list[dict[str, Any]]) -> bool:
    try:
        render(messages, True)
    except EngineError:
        return False
    return True
