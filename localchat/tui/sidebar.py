"""The sessions sidebar: sessions by last use; open, create, rename and delete them.

The sidebar only reports what the user asked for (typed messages); the app does it and then
calls ``show`` with the new list, so the store stays the one source of truth.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from localchat.store import SessionRecord


@dataclass
class SessionRequest(Message):
    """The user asked for ``action`` ("open", "new", "rename", "delete") on a session, or to
    ``leave`` the sidebar for the prompt."""

    action: str
    session_id: int | None


def session_line(session: SessionRecord, current: bool, now: float | None = None) -> Text:
    """Two lines: the session's label, then when it was last used and its newest message."""
    text = Text(("● " if current else "  ") + session.label)
    detail = when(session.updated_at, now) + (f" · {session.preview}" if session.preview else "")
    text.append("\n  " + detail, style="dim")
    return text


def when(timestamp: float, now: float | None = None) -> str:
    """``today 14:02``, ``yesterday 09:15``, ``Mar 3`` or ``2024-03-03`` (older years)."""
    moment, today = time.localtime(timestamp), time.localtime(now)
    days = (datetime.date(*today[:3]) - datetime.date(*moment[:3])).days
    if days == 0:
        return time.strftime("today %H:%M", moment)
    if days == 1:
        return time.strftime("yesterday %H:%M", moment)
    return time.strftime("%b %d" if moment.tm_year == today.tm_year else "%Y-%m-%d", moment)


class SessionList(OptionList):
    BINDINGS = [
        Binding("n", "request('new')", "New"),
        Binding("r", "request('rename')", "Rename"),
        Binding("d,delete", "request('delete')", "Delete"),
        Binding("escape", "request('leave')", "Back", show=False),
    ]

    def action_request(self, action: str) -> None:
        self.post_message(SessionRequest(action, self.highlighted_session_id))

    @property
    def highlighted_session_id(self) -> int | None:
        if self.highlighted is None:
            return None
        return _session_id(self.get_option_at_index(self.highlighted))


class SessionSidebar(Vertical):
    def compose(self) -> ComposeResult:
        yield Label("Sessions", classes="title")
        yield SessionList()

    @property
    def sessions(self) -> SessionList:
        return self.query_one(SessionList)

    def show(self, sessions: list[SessionRecord], current_id: int | None) -> None:
        """List ``sessions`` (already sorted by last use). The highlight stays on the session it
        was on, so a rename or delete does not move the user's place; else it marks the current."""
        options = self.sessions
        keep = options.highlighted_session_id
        options.clear_options()
        options.add_options(Option(session_line(s, s.id == current_id), id=str(s.id)) for s in sessions)
        ids = [s.id for s in sessions]
        for wanted in (keep, current_id):
            if wanted in ids:
                options.highlighted = ids.index(wanted)
                break

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(SessionRequest("open", _session_id(event.option)))


def _session_id(option: Option) -> int:
    assert option.id is not None  # every session option is made with its id
    return int(option.id)
