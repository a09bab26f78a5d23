"""Typed messages the worker threads post to the app (``post_message`` is thread-safe).

Workers never touch widgets; they report what happened and the app updates the screen on its
own thread, in order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from localchat.events import Done, Event, Loaded, Thinking, Token

if TYPE_CHECKING:
    from localchat.engine.options import Sampling
    from localchat.store import TurnRecord
    from localchat.tui.app_engine import AppEngine


@dataclass
class ModelLoading(Message):
    """Loading progress of the model being opened."""

    model: str
    fraction: float


@dataclass
class ModelReady(Message):
    """A model finished loading; ``engine`` is ready for turns with ``sampling`` (None: defaults).
    ``model_ref`` is what the user named (None: the default model)."""

    engine: AppEngine
    loaded: Loaded
    sampling: Sampling | None
    model_ref: str | None = None


@dataclass
class ModelFailed(Message):
    """The model could not be found or loaded; ``message`` is one line for the user. ``kept``:
    the model in use before stays (or is being loaded again)."""

    model: str
    message: str
    kept: bool = False
    model_ref: str | None = None  # what was asked for (None: the default model)


class SessionChanged(Message):
    """The store's record of the open session changed (a prompt titled it): refresh labels."""


@dataclass
class TurnsArrived(Message):
    """Turn ``turn_id`` found ``turns`` another process stored (an ``ask -s``) since the screen
    was drawn; the model sees them, so they are shown above its prompt."""

    turn_id: int
    turns: list[TurnRecord]


@dataclass
class TurnWake(Message):
    """Turn ``turn_id`` has new events in its ``TurnMailbox``."""

    turn_id: int


class TurnMailbox:
    """A turn's events, handed from the generation thread to the UI thread.

    The worker ``put``s every event; a wake-up message is posted only when none is pending, and
    the UI ``take``s everything that arrived since its last look. So tokens that come while the
    UI is busy (or waiting for its next frame) are merged into one update instead of queueing up
    one message each: per-token messages made the UI thread wake and take the GIL per token,
    which slowed decoding, since the engine thread needs the GIL after every llama_decode.
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._events: list[Event | ToolRoundDone] = []
        self._wake_pending = False

    def put(self, event: Event | ToolRoundDone) -> None:
        """Worker thread: add an event; wake the UI unless a wake-up is already on its way."""
        with self._lock:
            self._events.append(event)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._wake()

    def take(self) -> list[Event | TokenRun | ThinkingRun | ToolRoundDone]:
        """UI thread: everything since the last ``take``, in order, runs of tokens merged."""
        with self._lock:
            events, self._events = self._events, []
            self._wake_pending = False
        return merge_tokens(events)


@dataclass(frozen=True)
class ToolRoundDone:
    """A reply of the turn ended by calling tools, and the turn goes on (its tool round, then
    the model's next reply): not the turn's final ``Done``."""

    done: Done


@dataclass(frozen=True)
class TokenRun:
    """Consecutive ``Token`` events merged: their text, and how many there were."""

    text: str
    count: int


@dataclass(frozen=True)
class ThinkingRun:
    """Consecutive ``Thinking`` events merged: the reasoning text, and how many there were."""

    text: str
    count: int


def merge_tokens(events: list[Event | ToolRoundDone]) -> list[Event | TokenRun | ThinkingRun | ToolRoundDone]:
    """Runs of Token (and of Thinking) events merged into one TokenRun (ThinkingRun) each."""
    merged: list[Event | TokenRun | ThinkingRun | ToolRoundDone] = []
    run: list[str] = []
    kind: type | None = None
    for event in [*events, None]:
        if isinstance(event, (Token, Thinking)) and (kind is None or isinstance(event, kind)):
            kind = type(event)
            run.append(event.text)
            continue
        if run:
            merged.append((TokenRun if kind is Token else ThinkingRun)("".join(run), len(run)))
            run, kind = [], None
        if isinstance(event, (Token, Thinking)):
            kind = type(event)
            run.append(event.text)
        elif event is not None:
            merged.append(event)
    return merged
