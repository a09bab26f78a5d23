"""The prompt: a multi-line input where Enter sends, Ctrl+J inserts a newline, Up recalls.

Most terminals send the same bytes for Enter and Shift+Enter, so a newline needs a key of its
own: Ctrl+J (a line feed, distinct from Enter's carriage return everywhere). Shift+Enter and
Alt+Enter also work where the terminal reports them. Pasted text keeps its newlines.
"""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.message import Message
from textual.widgets import Static, TextArea

from localchat.tui.slash import Completion

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(TextArea):
    class Submitted(Message):
        """The user pressed Enter on a non-empty prompt."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(
        self,
        history: list[str],
        completer: Callable[[str], list[Completion]],
        *,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id, soft_wrap=True, tab_behavior="focus", compact=True)
        self.prompt_history = history
        self.completer = completer
        self._browsing: int | None = None  # index into history while recalling
        self._draft = ""  # what was typed before recalling started

    def remember(self, text: str) -> None:
        """Add a sent prompt to the history and stop recalling."""
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._browsing = None

    async def _on_key(self, event: events.Key) -> None:
        handled = (
            self._submit() if event.key == "enter"
            else self._newline() if event.key in NEWLINE_KEYS
            else self._recall(-1) if event.key == "up" and self.cursor_location[0] == 0
            else self._recall(+1) if event.key == "down" and self._on_last_line()
            else self._complete() if event.key == "tab"
            else False
        )
        if handled:
            event.stop()
            event.prevent_default()
        else:
            await super()._on_key(event)

    def _submit(self) -> bool:
        if self.text.strip():
            self.post_message(self.Submitted(self.text))
        return True

    def _newline(self) -> bool:
        self.insert("\n")
        return True

    def _on_last_line(self) -> bool:
        return self.cursor_location[0] == self.document.line_count - 1

    def _recall(self, step: int) -> bool:
        """Show the previous (-1) or next (+1) prompt from the history; False if none."""
        if self._browsing is None:
            if step > 0 or not self.prompt_history:
                return False
            self._draft, index = self.text, len(self.prompt_history) - 1
        else:
            index = self._browsing + step
            if index < 0:
                return True  # at the oldest prompt: stay
        if index >= len(self.prompt_history):
            self._browsing = None
            self._show(self._draft)
            return True
        self._browsing = index
        self._show(self.prompt_history[index])
        return True

    def _show(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    def _complete(self) -> bool:
        """Tab after ``/`` completes a command or model name as far as it is unambiguous."""
        options = self.completer(self.text)
        if not options:
            return False
        common = options[0].text
        for option in options[1:]:
            while not option.text.startswith(common):
                common = common[:-1]
        if len(common) > len(self.text):
            self._show(common)
        return True


class CommandHints(Static):
    """Suggestions under the prompt while a slash command is typed (Tab completes)."""

    MAX_SHOWN = 6

    def show(self, options: list[Completion]) -> None:
        self.display = bool(options)
        if not options:
            return
        width = max(len(o.label) for o in options[: self.MAX_SHOWN])
        lines = [f"{o.label.ljust(width)}  {o.help}".rstrip() for o in options[: self.MAX_SHOWN]]
        if len(options) > self.MAX_SHOWN:
            lines.append(f"… {len(options) - self.MAX_SHOWN} more")
        self.update("\n".join(lines))
