"""How one loaded model's chat template turns a conversation into a prompt: plain, with the
thinking switch, with tools offered or calls in its history (what the template does with tools is
probed once, at the first turn that needs it), and what the template costs around a message.

The engine holds one per loaded model (a fresh one at each load) and asks it for the renderer
and the messages as rendered; it never looks at the template itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localchat.engine.layout import ChatPrompt
from localchat.engine.options import Sampling
from localchat.engine.templates import Render, has_thinking_switch, with_thinking
from localchat.engine.tool_templates import ToolRendering, tool_rendering
from localchat.engine.tool_turn import ToolPlan, needs_plan, plain_render
from localchat.engine.tool_turn import plan as plan_tools
from localchat.errors import EngineError
from localchat.reply.families import detect_format


def _no_model(*args: Any, **kwargs: Any) -> str:
    """The renderer before a model (and with it a chat template) is loaded."""
    raise EngineError("no model is loaded")


class ModelPrompts:
    """One model's chat template (``render`` made from ``template``), for every turn's prompt."""

    def __init__(self, template: str = "", render: Render = _no_model) -> None:
        self.template = template
        self.render = render
        self._tool_rendering: ToolRendering | None = None  # probed at the first turn with tools
        self._overhead: int | None = None

    def __repr__(self) -> str:
        return f"<ModelPrompts {len(self.template)}-character template>"

    @property
    def supports_thinking(self) -> bool:
        """Whether the template has a thinking switch (``Sampling.thinking`` on/off)."""
        return has_thinking_switch(self.template)

    @property
    def preserved_tokens(self) -> tuple[str, ...]:
        """The special tokens its family's tool calls are written with (shown as text, so that
        calls can be read)."""
        return detect_format(self.template).preserved_tokens

    def rendering(self) -> ToolRendering:
        """What the template does with tools (probed once)."""
        if self._tool_rendering is None:
            self._tool_rendering = tool_rendering(self.template, self.render)
        return self._tool_rendering

    def tool_plan(self, messages: list[dict], sampling: Sampling) -> ToolPlan | None:
        """How a turn with tools, or with calls in its history, renders and reads its reply."""
        if not needs_plan(messages, sampling):
            return None
        return plan_tools(self.render, self.rendering(), self.template, messages, sampling)

    def turn_render(self, tools: ToolPlan | None, sampling: Sampling) -> Render:
        """The renderer of a turn with ``tools`` (its plan, None without one) and ``sampling``'s
        thinking mode."""
        return with_thinking(tools.render if tools is not None else self.render,
                             sampling.thinking, self.supports_thinking)

    def chat_prompt(self, messages: list[dict], sampling: Sampling,
                    tools: ToolPlan | None) -> ChatPrompt:
        """The prompt a chat turn for ``messages`` lays out, with ``tools`` (its ``tool_plan``)
        and ``sampling``'s thinking mode: what its layout is planned on, and what a cached state
        is weighed against (``state_pool``, ``engine.slots``)."""
        shaped = tools.messages if tools is not None else messages
        render = self.turn_render(tools, sampling)
        return ChatPrompt(shaped, render(shaped, True), render)

    def render_for(self, messages: list[dict],
                   sampling: Sampling | None) -> tuple[Render, list[dict]]:
        """(renderer, messages as rendered) for a prompt of ``messages`` with ``sampling``'s
        tools (None: none offered)."""
        if sampling is not None and sampling.tools:
            tools = self.tool_plan(messages, sampling)
            if tools is not None:
                return tools.render, tools.messages
        return plain_render(self.render, self.rendering, messages)

    def overhead(self, tokenize: Callable[[str, bool], list[int]]) -> int:
        """Template tokens around one user message plus the assistant header and the previous
        reply's end marker (measured once)."""
        if self._overhead is None:
            probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            before = self.render(probe, False)
            after = self.render(probe + [{"role": "user", "content": "z"}], True)
            delta = after.removeprefix(before)
            self._overhead = max(1, len(tokenize(delta, False)) - 1) + 2
        return self._overhead
