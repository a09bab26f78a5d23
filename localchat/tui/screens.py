"""Modal screens: help, a yes/no confirmation, a one-line text question, and a Markdown page."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown, OptionList
from textual.widgets.option_list import Option

if TYPE_CHECKING:
    from localchat.tui.host import Host

KEYS = (
    ("Enter", "send the message"),
    ("Ctrl+J", "new line in the message (also Shift+Enter or Alt+Enter where the terminal reports them)"),
    ("↑ / ↓", "earlier / later prompts (on the first / last line of the input)"),
    ("Tab", "complete a /command, a model name, an @path or /image's picture path"),
    ("Backspace (empty input)", "remove the last attached picture (/image clear removes them all)"),
    ("PageUp / PageDown", "scroll the conversation (also while typing)"),
    ("Alt+↑ or Ctrl+↑", "select a message: ↑/↓ move, c copies, 1-9 copy code block N, e edits a prompt "
                        "(Enter resends, forking the conversation), ←/→ other versions, Esc back"),
    ("Ctrl+E", "write the message in $VISUAL / $EDITOR"),
    ("Esc", "remove the newest queued message; else stop the reply (the partial reply is kept, "
            "marked stopped)"),
    ("Ctrl+C", "stop the reply; when idle, asks before quitting"),
    ("y / a / s / n", "when the model calls a tool: run it once / always this session (run_command: "
                      "this exact command) / always, saved in config.toml / deny (also Esc)"),
    ("Esc (a tool running)", "cancel the call and stop the reply"),
    ("click a ⚙ line", "open or fold the tool's result (Enter when it has the focus)"),
    ("Ctrl+Q", "quit"),
    ("Ctrl+N", "new session"),
    ("Ctrl+B", "show / hide the sessions sidebar"),
    ("Ctrl+T", "open / fold the reasoning of thinking models (click a block's title for one)"),
    ("Ctrl+P", "command palette (every command below, plus themes)"),
    ("F1 or ?", "this help (? when the input is not focused)"),
)

SIDEBAR_KEYS = (
    ("Enter", "open the session"),
    ("n", "new session"),
    ("r", "rename"),
    ("d / Delete", "delete (asks first)"),
    ("Esc", "back to the input"),
)

STATUS_FIELDS = (
    ("TTFT", "time to first token of the current or last reply, in ms"),
    ("answer", "thinking models: time to the first token of the answer, after the reasoning"),
    ("TPOT", "time per output token after the first, in ms"),
    ("tok/s", "generation speed"),
    ("reused · new", "prompt tokens reused from the KV cache (cache_n) · prefilled this turn (prompt_n)"),
    ("ctx", "tokens in the context / context size"),
    ("local / remote", "which model answered"),
)


def help_markdown(commands: Sequence[tuple[str, str]]) -> str:
    """The help page; ``commands``: each command's usage and help."""

    def table(rows: Sequence[tuple[str, str]], head: tuple[str, str]) -> str:
        lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
        lines += [f"| `{a}` | {b} |" for a, b in rows]
        return "\n".join(lines)

    return "\n\n".join(
        (
            "# localchat",
            "## Keys",
            table(KEYS, ("Key", "Does")),
            "## Commands",
            table(commands, ("Command", "Does")) + "\n\nStart a message with `//` to send a literal `/`.",
            "## Sessions sidebar",
            table(SIDEBAR_KEYS, ("Key", "Does")),
            "## Status bar",
            table(STATUS_FIELDS, ("Field", "Means")),
        )
    )


class PageScreen(ModalScreen[None]):
    """A scrollable Markdown page; Esc closes it."""

    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close")]

    def __init__(self, markdown: str) -> None:
        super().__init__()
        self._markdown = markdown

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="page"):
            yield Markdown(self._markdown)


class HelpScreen(PageScreen):
    def __init__(self, commands: Sequence[tuple[str, str]]) -> None:
        super().__init__(help_markdown(commands))


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question. Enter or y answers yes; Esc or n answers no."""

    BINDINGS = [
        Binding("y,enter", "answer(True)", "Yes", priority=True),
        Binding("n,escape", "answer(False)", "No", priority=True),
    ]

    def __init__(self, question: str, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__()
        self._question = question
        self._yes = yes
        self._no = no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._question, markup=False)
            with Horizontal(classes="buttons"):
                yield Button(f"{self._yes} (y)", variant="error", id="yes")
                yield Button(f"{self._no} (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def ask_from_worker(host: Host, question: str, yes: str, no: str) -> bool:
    """Ask ``question`` with a ``ConfirmScreen`` from a worker thread, and wait for the answer
    while the UI stays live."""
    answered, answer = threading.Event(), []

    def record(choice: bool | None) -> None:
        answer.append(bool(choice))
        answered.set()

    host.call_from_thread(host.push_screen, ConfirmScreen(question, yes=yes, no=no), record)
    answered.wait()
    return answer[0]


class AskTextScreen(ModalScreen[str | None]):
    """Ask for one line of text (a session name). Enter accepts, Esc cancels (None)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self._question = question
        self._value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._question, markup=False)
            yield Input(self._value, select_on_focus=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SearchScreen(ModalScreen[int | None]):
    """Search results (``/search``): one line per matching message under its session's label;
    Enter opens that session (dismissed with its id), Esc closes."""

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, query: str, hits: list[tuple[int, str, str]]) -> None:
        """``hits``: (session id, session label, "you: …" or "reply: …" snippet), best first."""
        super().__init__()
        self._query = query
        self._hits = hits

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog search"):
            yield Label(f"{len(self._hits)} message{'s' if len(self._hits) != 1 else ''} "
                        f"containing “{self._query}” · Enter opens · Esc closes", markup=False)
            yield OptionList(*(Option(Text(f"{label}\n  {snippet}"), id=f"{index}:{session_id}")
                               for index, (session_id, label, snippet) in enumerate(self._hits)))

    def on_mount(self) -> None:
        results = self.query_one(OptionList)
        results.highlighted = 0
        results.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        assert event.option.id is not None  # every result is made with "session:turn"
        self.dismiss(int(event.option.id.split(":")[1]))

    def action_close(self) -> None:
        self.dismiss(None)
