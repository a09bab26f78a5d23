"""What the store hands out: plain, immutable records of sessions and turns."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

from localchat.events import Timings

Role = Literal["user", "assistant"]

UNTITLED = "New chat"


@dataclass(frozen=True)
class SessionRecord:
    """One conversation as stored. ``name`` is what the user chose; ``title`` is derived."""

    id: int
    name: str | None
    title: str
    system: str
    summary: str
    model: str
    created_at: float
    updated_at: float
    turn_count: int = 0
    last_message: str = ""  # the start of the newest message, for the sidebar's preview

    @property
    def preview(self) -> str:
        """The newest message on one short line."""
        return title_from_prompt(self.last_message, 60)

    @property
    def label(self) -> str:
        """What the user sees for this session: their chosen name, else the derived title."""
        return self.name or self.title or UNTITLED


@dataclass(frozen=True)
class TurnRecord:
    """One message in a session: the user's prompt or the assistant's reply."""

    id: int
    session_id: int
    seq: int
    role: Role
    content: str
    model: str = ""
    timings: Timings | None = None
    route: str = ""
    route_reason: str = ""
    finish_reason: str = ""
    stopped: bool = False
    created_at: float = 0.0
    local_model: str = ""  # the local model in charge of the turn (the one the router works for)
    fell_back: bool = False  # the remote was asked and failed, so this local reply stands


@dataclass(frozen=True)
class SearchHit:
    """A message that matched a search: where it is, and the words around the match."""

    session_id: int
    seq: int
    role: Role
    snippet: str
    created_at: float


_TIMING_FIELDS = {f.name for f in dataclasses.fields(Timings)}


def timings_to_json(timings: Timings | None) -> str | None:
    return None if timings is None else json.dumps(timings.to_dict(), sort_keys=True)


def timings_from_json(text: str | None) -> Timings | None:
    """Read back stored timings, ignoring derived or unknown fields (older or newer writers)."""
    if not text:
        return None
    data = json.loads(text)
    return Timings(**{k: v for k, v in data.items() if k in _TIMING_FIELDS})


def title_from_prompt(prompt: str, width: int = 48) -> str:
    """A one-line title from a session's first prompt: its first non-empty line, shortened."""
    line = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"
