"""What the store hands out: plain, immutable records of sessions and turns."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

from localchat.events import Timings
from localchat.reply.calls import ToolCall

Role = Literal["user", "assistant", "tool"]

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


_EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "GIF": "gif", "BMP": "bmp"}


@dataclass(frozen=True)
class ImageRef:
    """A picture a user's message carried: its key (the SHA-256 of the file's bytes, as the
    engine's records key it), the file's name when it was attached, and what its header said.
    The bytes are kept once per key beside the database (``store.images``)."""

    sha256: str
    name: str
    format: str  # "PNG", "JPEG", "GIF", "BMP"
    width: int
    height: int

    @property
    def file_name(self) -> str:
        """The stored copy's name: ``<sha256>.png``."""
        return f"{self.sha256}.{_EXTENSIONS.get(self.format, 'img')}"

    @property
    def label(self) -> str:
        """``cat.png 640x480``: how the conversation and exports name it."""
        return f"{self.name} {self.width}x{self.height}"

    def to_dict(self) -> dict[str, str | int]:
        return dataclasses.asdict(self)


def images_to_json(images: tuple[ImageRef, ...] | list[ImageRef]) -> str | None:
    return json.dumps([i.to_dict() for i in images], ensure_ascii=False) if images else None


def images_from_json(text: str | None) -> tuple[ImageRef, ...]:
    if not text:
        return ()
    fields = ("sha256", "name", "format", "width", "height")
    return tuple(ImageRef(**{k: entry[k] for k in fields}) for entry in json.loads(text))


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
    # Tool rounds: the calls an assistant turn asked for; a tool turn's call, tool and outcome.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    tool_name: str = ""
    tool_label: str = ""  # server.tool, as the user saw it
    is_error: bool = False
    notice: str = ""
    elapsed_ms: float = 0.0
    images: tuple[ImageRef, ...] = ()  # a user's turn: its pictures, in order

    @property
    def answer(self) -> str:
        """An assistant turn's text without its calls as the model wrote them (markers and
        JSON): what the user was shown. Other turns: their content."""
        text = self.content
        for call in self.tool_calls:
            if call.raw:
                text = text.replace(call.raw, "", 1)
        return text.strip() if self.tool_calls else text


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


_CALL_FIELDS = ("id", "name", "arguments", "problem", "incomplete", "raw")


def calls_to_json(calls: tuple[ToolCall, ...] | list[ToolCall]) -> str | None:
    if not calls:
        return None
    return json.dumps([{k: getattr(c, k) for k in _CALL_FIELDS} for c in calls],
                      ensure_ascii=False)


def calls_from_json(text: str | None) -> tuple[ToolCall, ...]:
    """Stored calls (a newer writer's extra fields ignored)."""
    if not text:
        return ()
    return tuple(ToolCall(**{k: v for k, v in entry.items() if k in _CALL_FIELDS})
                 for entry in json.loads(text))


def title_from_prompt(prompt: str, width: int = 48) -> str:
    """A one-line title from a session's first prompt: its first non-empty line, shortened."""
    line = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"
