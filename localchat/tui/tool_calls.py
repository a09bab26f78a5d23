"""A tool call in the chat log: one compact line, ``⚙ server.tool({"arg": ...})``, with its
result folded under it.

The line (the call cut to leave room) says where the call stands (waiting for the user's answer, running, how long it took,
denied, failed); a click on it, or Enter when it has the focus, opens the result. A result that
is an error (a denial, a timeout, a server that crashed) is marked ✖ and shown in the error
colour. Everything a tool or the model wrote is shown as inert text: no markup, no terminal
escapes (``localchat.terminal.visible``), and a very long result is cut for the screen (the model
got it whole, within the ``[tools]`` cap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import cast

from textual.content import Content
from textual.widgets import Static

from localchat.reply.calls import ToolCall, ToolResult
from localchat.terminal import visible
from localchat.tools.approval import call_line
from localchat.tui.retitled import RetitledCollapsible

DENIED = "denied by the user"  # what the model reads for a denied call (tools.results)
SHOWN_RESULT_CHARS = 4000  # of a result, on screen; the rest is summed up in one line
# Of the call in its line: room is left for how it went (an 80-column terminal, the log's
# margins); the whole call is the first line of the folded part.
TITLE_CALL_CHARS = 44


def plain(text: str) -> str:
    """``text`` as a title that is never read as markup (a call's arguments may hold brackets):
    Textual's Collapsible takes Content where its annotations say str."""
    return cast(str, Content(text))


def call_title(call: ToolCall, label: str) -> str:
    """``⚙ server.tool({...})``: the call as the user sees it, in one inert line."""
    shown = replace(call, name=label or call.name or "a tool call")
    return f"⚙ {call_line(shown)}"


def short_line(line: str, limit: int = TITLE_CALL_CHARS) -> str:
    """The call's line cut to ``limit`` characters (``…)`` says where)."""
    return line if len(line) <= limit else line[:limit - 2] + "…)"


def shown_result(content: str) -> str:
    """A result as the screen shows it: inert, and cut to ``SHOWN_RESULT_CHARS``."""
    text = visible(content.rstrip()) or "(empty result)"
    if len(text) <= SHOWN_RESULT_CHARS:
        return text
    rest = len(text) - SHOWN_RESULT_CHARS
    return f"{text[:SHOWN_RESULT_CHARS]}\n… {rest:,} more characters (the model read them all)"


def without_calls(answer: str, calls: Sequence[ToolCall]) -> str:
    """A reply's answer as the user reads it: the calls it made (their markers and JSON, kept
    in the history for the model) taken out."""
    for call in calls:
        if call.raw:
            answer = answer.replace(call.raw, "")
    return answer.strip() if calls else answer


def elapsed_text(elapsed_ms: float) -> str:
    return f"{elapsed_ms:.0f} ms" if elapsed_ms < 1000 else f"{elapsed_ms / 1000:.1f} s"


class ToolCallView(RetitledCollapsible):
    """One call and, once it returned, its result (collapsed until the user opens it)."""

    DEFAULT_CSS = """
    ToolCallView { border: none; padding: 0; margin: 0; background: transparent; }
    ToolCallView > Contents { padding: 0 0 0 4; }
    ToolCallView CollapsibleTitle { color: $text-muted; }
    ToolCallView .tool-result { color: $text-muted; }
    ToolCallView .tool-call { color: $text-muted; text-style: italic; }
    ToolCallView.-error CollapsibleTitle { color: $error; }
    ToolCallView.-error .tool-result { color: $error; }
    ToolCallView.-asking CollapsibleTitle { color: $warning; text-style: bold; }
    """

    def __init__(self, call: ToolCall, label: str, *, result: ToolResult | None = None,
                 elapsed_ms: float = 0.0) -> None:
        line = call_title(call, label)
        self._result_text = Static("", markup=False, classes="tool-result")
        parts = [Static(line, markup=False, classes="tool-call")] if short_line(line) != line else []
        super().__init__(*parts, self._result_text, title=plain(short_line(line)), collapsed=True)
        self.call = call
        self.call_id = call.id
        self.line = line
        self.label = label
        self.state = "called"
        self.result: ToolResult | None = None
        if result is not None:
            self.show_result(result, elapsed_ms)

    def __repr__(self) -> str:
        return f"<ToolCallView {self.line!r} {self.state}>"

    def _set_state(self, state: str, note: str = "") -> None:
        self.state = state
        shown = short_line(self.line)
        self.title = plain(f"{shown}  {note}" if note else shown)

    def asking(self) -> None:
        """The user is being asked whether it may run."""
        self.set_class(True, "-asking")
        self._set_state("asking", "· waiting for your answer")

    def answered(self, allowed: bool) -> None:
        self.set_class(False, "-asking")
        self._set_state("running" if allowed else "denied", "· running…" if allowed else "· denied")

    def running(self) -> None:
        if self.state == "called":
            self._set_state("running", "· running…")

    def stopped(self) -> None:
        """The turn was stopped before this call returned (Esc cancels a running call)."""
        if self.result is None:
            self.set_class(False, "-asking")
            self.set_class(True, "-error")
            self._set_state("stopped", "· ✖ stopped")

    def show_result(self, result: ToolResult, elapsed_ms: float = 0.0) -> None:
        """The call ended: its result folded under the line, the line saying how it went."""
        self.result = result
        self.set_class(False, "-asking")
        self.set_class(result.is_error, "-error")
        self._result_text.update(shown_result(result.content))
        lines = len(result.content.rstrip("\n").splitlines())
        size = f"{lines} line{'s' if lines != 1 else ''}"
        took = f" · {elapsed_text(elapsed_ms)}" if elapsed_ms else ""
        if self.state == "denied" or result.is_error and result.content == DENIED:
            self._set_state("denied", "· ✖ denied")
        elif result.is_error:
            why = result.notice.removeprefix(f"{self.label}: ") or result.content
            self._set_state("failed", f"· ✖ {visible(why, newlines=False)[:80]}")
        else:
            self._set_state("done", f"· ✓ {size}{took}")
