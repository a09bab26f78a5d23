"""What the app needs of an engine (``AppEngine``) and how it gets one (``EngineFactory``).

Its own small module: the model's state (``model_state``) and the messages its loading worker
posts (``messages``) both name it, and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from localchat.chat.conversation import ChatEngine

if TYPE_CHECKING:
    from localchat.events import Loaded


class AppEngine(ChatEngine, Protocol):
    """What the app needs from an engine besides a conversation's turns: the model checked, then
    loaded off the UI thread, its name, whether it has a thinking switch, and its memory freed."""

    @property
    def name(self) -> str: ...

    @property
    def supports_thinking(self) -> bool: ...

    def preflight(self) -> object:
        """Check without loading weights that the model can be loaded (raises ``UserError``)."""
        ...

    def load(self, on_progress: Callable[[float], None] | None = None) -> Loaded: ...

    def close(self) -> None: ...


EngineFactory = Callable[[str | None], AppEngine]
