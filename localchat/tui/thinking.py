"""The "Thinking…" block above a reasoning model's answer.

It opens while the model reasons, streaming the text as it comes (plain text: Markdown would read
``<think>``-style tags and half-written constructs as HTML and drop them), and folds away when the
answer starts, so the answer reads on its own. A click on its title, or Ctrl+T for every block
(``show_thinking``), opens it again.
"""

from __future__ import annotations

from textual.widgets import Static

from localchat.events import Timings
from localchat.tui.retitled import RetitledCollapsible


def thinking_title(timings: Timings | None = None, *, streaming: bool = False, stopped: bool = False) -> str:
    """``Thinking…`` while it streams; afterwards how much thinking the answer took."""
    if streaming:
        return "Thinking…"
    parts = ["Thought"]
    if timings is not None and timings.thinking_n:
        parts.append(f"{timings.thinking_n} tokens")
    if timings is not None and timings.time_to_answer_ms:
        parts.append(f"answer after {timings.time_to_answer_ms / 1000:.1f} s")
    if stopped:
        parts.append("stopped")
    return " · ".join(parts)


class ThinkingBlock(RetitledCollapsible):
    """A reply's reasoning: collapsible, dimmed, streamed while the model thinks."""

    DEFAULT_CSS = """
    ThinkingBlock { border: none; padding: 0; margin: 0 0 1 0; background: transparent; }
    ThinkingBlock > Contents { padding: 0 0 0 2; }
    ThinkingBlock .thinking-text { color: $text-muted; text-style: italic; }
    """

    def __init__(self, text: str = "", *, streaming: bool = False, expanded: bool = False,
                 title: str = "") -> None:
        super().__init__(Static(text, markup=False, classes="thinking-text"),
                         title=title or thinking_title(streaming=streaming),
                         collapsed=not (streaming or expanded))
        self.text = text
        self.streaming = streaming

    def __repr__(self) -> str:
        state = "streaming" if self.streaming else "collapsed" if self.collapsed else "open"
        return f"<ThinkingBlock {state} {len(self.text)} chars>"

    def append(self, fragment: str) -> None:
        self.text += fragment
        self.query_one(".thinking-text", Static).update(self.text)

    def answer_started(self, *, keep_open: bool) -> None:
        """The answer begins: stop streaming and fold away unless the user wants it open."""
        if not self.streaming:
            return
        self.streaming = False
        self.title = thinking_title()
        self.collapsed = not keep_open

    def finish(self, text: str, timings: Timings | None, *, stopped: bool, keep_open: bool) -> None:
        """The turn ended: show the whole reasoning as recorded and what it cost."""
        if self.streaming:
            self.answer_started(keep_open=keep_open)
        text = text.strip()
        if text and text != self.text:
            self.text = text
            self.query_one(".thinking-text", Static).update(text)
        self.title = thinking_title(timings, stopped=stopped)
