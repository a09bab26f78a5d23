"""What a part of the app may ask of the app: ``Host``.

The app's parts (``model_state``, ``turn``, ``sessions``, ``slash_commands``, ...) each get the
app as their ``Host`` and the siblings they use as constructor arguments, so none of them
imports ``app.py``: the app (``app.LocalChatApp``, the one host) is the one place that knows all
parts and wires them (Textual's "attributes down, messages up").

A handler a dialog or a message calls is ``@shows_user_errors``: a ``UserError`` it raises
becomes a one-line notice.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from localchat.errors import UserError

if TYPE_CHECKING:
    from textual.message import Message
    from textual.screen import Screen
    from textual.timer import Timer
    from textual.widget import Widget

    from localchat.chat.conversation import Conversation
    from localchat.store import Store
    from localchat.tui.chat_log import ChatLog
    from localchat.tui.prompt import PromptInput
    from localchat.tui.sidebar import SessionSidebar
    from localchat.tui.status import StatusBar

W = TypeVar("W", bound="Widget")


class Host(Protocol):
    """The app as its parts see it: the store and the open conversation, the widgets they
    update, notices, screens, workers and timers."""

    store: Store
    conversation: Conversation | None  # the open session's (only ``Sessions`` sets it)

    @property
    def chat_log(self) -> ChatLog: ...

    @property
    def prompt(self) -> PromptInput: ...

    @property
    def status(self) -> StatusBar: ...

    @property
    def sidebar(self) -> SessionSidebar: ...

    @property
    def screen(self) -> Screen[object]: ...

    @property
    def focused(self) -> Widget | None: ...

    @property
    def closed(self) -> bool:
        """Unmounted: workers still running must not touch the app."""
        ...

    @property
    def is_running(self) -> bool: ...

    def query_one(self, selector: type[W]) -> W: ...

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = False, cause: str = "") -> None:
        """A toast; one with a ``cause`` is withdrawn by ``withdraw_notices(cause)``."""
        ...

    def withdraw_notices(self, cause: str) -> None: ...

    def set_state(self, state: str) -> None:
        """The status bar's state field ("idle", "generating", ...)."""
        ...

    def save_setting(self, key: str, value: str) -> None: ...

    def copy_text(self, text: str) -> None:
        """Copy ``text`` to the clipboard (``clipboard.copy_text``)."""
        ...

    def copy_to_clipboard(self, text: str) -> None: ...

    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], Any] | None = None) -> object: ...

    def pop_screen(self) -> object: ...

    def suspend(self) -> AbstractContextManager[None]: ...

    def run_worker(self, work: Any, name: str | None = "", group: str = "default", description: str = "",
                   exit_on_error: bool = True, start: bool = True, exclusive: bool = False,
                   thread: bool = False) -> object: ...

    def call_from_thread(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def post_message(self, message: Message) -> bool: ...

    def set_timer(self, delay: float, callback: Callable[[], Any] | None = None, *,
                  name: str | None = None, pause: bool = False) -> Timer: ...

    def refresh_bindings(self) -> None: ...

    def exit(self, result: Any = None, return_code: int = 0, message: Any = None) -> None: ...


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def shows_user_errors(handler: F) -> F:
    """Run a part's async handler; a ``UserError`` it raises becomes an error notice (the part
    keeps its host in ``self._host``)."""

    @functools.wraps(handler)
    async def wrapper(self: Any, *args: Any) -> Any:
        try:
            return await handler(self, *args)
        except UserError as exc:
            self._host.notify(str(exc), severity="error")
            return None

    return wrapper  # type: ignore[return-value]
