"""Typed messages the worker threads post to the app (``post_message`` is thread-safe).

Workers never touch widgets; they report what happened and the app updates the screen on its
own thread, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

from localchat.events import Event, Loaded

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling


class ModelLoading(Message):
    """Loading progress of the model being opened."""

    def __init__(self, model: str, fraction: float) -> None:
        super().__init__()
        self.model = model
        self.fraction = fraction


class ModelReady(Message):
    """A model finished loading; ``engine`` is ready for turns with ``sampling`` (None: defaults)."""

    def __init__(self, engine: Engine, loaded: Loaded, sampling: Sampling | None) -> None:
        super().__init__()
        self.engine = engine
        self.loaded = loaded
        self.sampling = sampling


class ModelFailed(Message):
    """The model could not be found or loaded; ``message`` is one line for the user."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__()
        self.model = model
        self.message = message


class TurnUpdate(Message):
    """One engine event of turn ``turn_id`` (PrefillProgress, Token, Notice, Done, Failed).

    A ``Done`` is posted only after its reply is committed to the store.
    """

    def __init__(self, turn_id: int, event: Event) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.event = event
