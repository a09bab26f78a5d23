"""The question before a tool runs: which tool, on which server, with which arguments, and the
user's answer in one key.

- **y**: run it this once;
- **a**: always, for this tool until localchat exits (for ``run_command``: this exact command
  only, Ollama's rule: "always" for ``ls`` must not cover ``rm``);
- **s**: always, saved in config.toml's ``[tools.always_allow]`` (only when the request
  ``can_save``: never for ``run_command``);
- **n** or **Esc**: deny; the model is told "denied by the user" and goes on.

The screen sits at the bottom over the chat log, which stays visible and live behind it. It
answers nothing itself: it is dismissed with the :class:`~localchat.tools.Decision` and the
app answers the request (``Turns``), which is what the tool rounds wait on.
"""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from localchat.events import ApprovalQuestion, Decision
from localchat.terminal import visible

SETTLED_POLL_S = 0.25


def arguments_text(request: ApprovalQuestion) -> str:
    """The call's arguments as indented JSON, inert and whole: what is approved is all shown (a
    long command's tail, ``; rm …``, was hidden behind "… N more characters"); the box scrolls."""
    return visible(json.dumps(request.call.arguments, indent=2, ensure_ascii=False))


def keys_line(request: ApprovalQuestion) -> str:
    always = "always this exact command" if request.per_command else "always this session"
    keys = ["y once", f"a {always}"]
    if request.can_save:
        keys.append("s always, saved")
    keys.append("n/Esc deny")
    return "   ".join(keys)


class ApprovalScreen(ModalScreen[Decision]):
    """Ask whether a tool call may run (see the module)."""

    BINDINGS = [
        Binding("y", "decide('once')", "Run once", priority=True),
        Binding("a", "decide('session')", "Always (session)", priority=True),
        Binding("s", "decide('save')", "Always (saved)", priority=True),
        Binding("n,escape", "decide('deny')", "Deny", priority=True),
    ]

    DEFAULT_CSS = """
    ApprovalScreen { align: center bottom; background: $background 30%; }
    ApprovalScreen .approval { width: 100%; height: auto; max-height: 80%; border: round $warning;
                               background: $surface; padding: 0 1; margin: 0 0 3 0; }
    ApprovalScreen .approval > Label { width: 100%; }
    ApprovalScreen .tool-name { text-style: bold; }
    ApprovalScreen .arguments { height: auto; max-height: 12; }
    ApprovalScreen .arguments Static { color: $text-muted; }
    ApprovalScreen .keys { color: $accent; margin: 1 0 0 0; }
    """

    def __init__(self, request: ApprovalQuestion) -> None:
        super().__init__()
        self.request = request

    def compose(self) -> ComposeResult:
        tool = self.request.tool
        with Vertical(classes="approval") as box:
            box.border_title = "⚙ Run this tool?"
            yield Label(visible(f"{tool.name} · server {tool.server}", newlines=False),
                        markup=False, classes="tool-name")
            summary = tool.description.strip().splitlines()
            if summary:
                yield Label(visible(summary[0], newlines=False), markup=False)
            with VerticalScroll(classes="arguments"):
                yield Static(arguments_text(self.request), markup=False)
            yield Label(keys_line(self.request), markup=False, classes="keys")

    def on_mount(self) -> None:
        # The question may be settled elsewhere (the turn stopped, the session left): then the
        # screen goes by itself instead of waiting for a key that no longer decides anything.
        self.set_interval(SETTLED_POLL_S, self._settled_elsewhere)

    def _settled_elsewhere(self) -> None:
        if self.request.future.done() and self.app.screen is self:
            self.dismiss(self.request.future.result())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "decide" and parameters == ("save",):
            return self.request.can_save
        return True

    def action_decide(self, decision: str) -> None:
        self.dismiss(Decision(decision))
