"""TurnEngine: what the context needs from an engine to run a conversation's turns.

``engine.Engine`` implements it, and so does the scripted fake of the UI tests. The parts of
``context/`` that use it (``chat_context``, ``draft``, ``keeper``) import it from here, so none
of them has to import another for it.
"""

from __future__ import annotations

from typing import Any, Protocol

from localchat.engine.options import Sampling
from localchat.engine.turn import TurnHandle
from localchat.events import Turn


class TurnEngine(Protocol):
    """What a ChatContext needs from an engine: turns, and the cache prepared ahead of one.
    The context keeper (``keeper.ContextEngine``) and the KV snapshots
    (``chat.snapshots.SnapshotEngine``) need more of the same engine."""

    @property
    def n_params(self) -> int | None:
        """The local model's parameter count, which sets how readily a turn escalates (None:
        unknown)."""
        ...

    def submit(self, messages: list[dict[str, str]], sampling: Sampling | None = None) -> Turn: ...

    def prepare(self, messages: list[dict[str, str]],
                tools: tuple[dict[str, Any], ...] = ()) -> TurnHandle: ...

    def stop(self) -> None: ...
