"""The prompt: a multi-line input where Enter sends, Ctrl+J inserts a newline, Up recalls.

Most terminals send the same bytes for Enter and Shift+Enter, so a newline needs a key of its
own: Ctrl+J (a line feed, distinct from Enter's carriage return everywhere). Shift+Enter and
Alt+Enter also work where the terminal reports them. Pasted text keeps its newlines; a paste
the app takes as something else (the path of a dropped picture: ``take_paste``) is not inserted.
Backspace in an empty input says so (``EmptyBackspace``: it removes the last attached picture).

Input that starts with ``/`` is a command (``slash_commands``); ``//`` sends a message that
starts with ``/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import Static, TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
# Keys the terminal parser emits together arrive within microseconds; a person's two keys, tens
# of milliseconds apart. A ^ followed by another key sooner than this was not typed.
STRAY_ESCAPE_S = 0.01
# The keys under the prompt, longest first: the longest that fits the border is shown whole
# (Textual would cut the longest one mid-word at 60 columns).
KEY_HINTS = (
    "Enter send · Ctrl+J newline · PgUp/PgDn scroll · F1 help",
    "Enter send · Ctrl+J newline · F1 help",
    "Enter send · F1 help",
    "F1 help",
)
BORDER_CHROME = 6  # "╰─ " and " ─╯" around a border subtitle


def key_hint(width: int) -> str:
    """The longest of ``KEY_HINTS`` that fits a prompt ``width`` columns wide, or ""."""
    return next((hint for hint in KEY_HINTS if len(hint) <= width - BORDER_CHROME), "")


def is_command(text: str) -> bool:
    """True for input meant as a command: ``/word``. ``//text`` sends ``/text`` as a message."""
    return text.startswith("/") and not text.startswith("//")


def message_text(text: str) -> str:
    """The message that input which is not a command sends: ``//text`` sends ``/text``."""
    return text[1:] if text.startswith("//") else text


@dataclass(frozen=True)
class Completion:
    """One autocomplete suggestion: what Tab inserts, and what the hint line shows."""

    text: str
    label: str
    help: str = ""


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        """The user pressed Enter on a non-empty prompt."""

        text: str

    @dataclass
    class PageKey(Message):
        """PageUp / PageDown in the input: they scroll the chat (the input is a line or two)."""

        direction: int

    class EmptyBackspace(Message):
        """Backspace in an empty input."""

    def __init__(
        self,
        history: list[str],
        completer: Callable[[str], list[Completion]],
        *,
        take_paste: Callable[[str], bool] = lambda text: False,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id, soft_wrap=True, tab_behavior="focus", compact=True)
        self.prompt_history = history
        self.completer = completer
        self.take_paste = take_paste  # True: the app took the pasted text, it is not inserted
        self._browsing: int | None = None  # index into history while recalling
        self._draft = ""  # what was typed before recalling started
        self._pending_caret: events.Key | None = None  # see _stray_escape

    def on_resize(self, event: events.Resize) -> None:
        self.border_subtitle = key_hint(self.outer_size.width)

    def remember(self, text: str) -> None:
        """Add a sent prompt to the history and stop recalling."""
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._browsing = None

    async def _on_paste(self, event: events.Paste) -> None:
        # Not taken: TextArea's own handler (next in the MRO) inserts it.
        if self.take_paste(event.text):
            event.stop()
            event.prevent_default()

    async def _on_key(self, event: events.Key) -> None:
        if await self._stray_escape(event):
            event.stop()
            event.prevent_default()
            return
        if event.key == "backspace" and not self.text:
            self.post_message(self.EmptyBackspace())
        handled = (
            self._submit() if event.key == "enter"
            else self._newline() if event.key in NEWLINE_KEYS
            else self._recall(-1) if event.key == "up" and self.cursor_location[0] == 0
            else self._recall(+1) if event.key == "down" and self._on_last_line()
            else self._complete() if event.key == "tab"
            else self._page(-1) if event.key == "pageup"
            else self._page(+1) if event.key == "pagedown"
            else False
        )
        if handled:
            event.stop()
            event.prevent_default()
        else:
            await super()._on_key(event)

    async def _stray_escape(self, event: events.Key) -> bool:
        """Textual 8.2.8 turns an ESC it could not resolve into a ``^`` key (its parser's
        ``reissue_sequence_as_keys``): Esc then Enter, followed within its escape delay by any
        other escape sequence (an arrow key, a mouse report), arrives as ``^`` + Enter in one
        burst. A ``^`` is therefore held back until the next key: if that key comes in the same
        burst (no one types two keys within STRAY_ESCAPE_S) the ``^`` was an Esc and is dropped.
        Returns True when ``event`` itself was consumed (held back)."""
        pending, self._pending_caret = self._pending_caret, None
        if pending is not None and event.time - pending.time > STRAY_ESCAPE_S:
            await super()._on_key(pending)  # a real ^, typed by a person
        if event.key == "circumflex_accent" and event.character == "^":
            self._pending_caret = event
            self.set_timer(STRAY_ESCAPE_S, self._release_caret)
            return True
        return False

    async def _release_caret(self) -> None:
        pending, self._pending_caret = self._pending_caret, None
        if pending is not None:
            await super()._on_key(pending)

    def _submit(self) -> bool:
        if self.text.strip():
            self.post_message(self.Submitted(self.text))
        return True

    def _page(self, direction: int) -> bool:
        self.post_message(self.PageKey(direction))
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
