"""Sessions in the app: opening one (the conversation it continues), the sidebar's list and its
requests (open, new, rename, delete), and the status bar's numbers for the open session.

Handlers called from a dialog or a message are ``@shows_user_errors``: a ``UserError`` they raise
becomes a one-line notice.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from localchat.chat.conversation import Conversation
from localchat.chat.services import ChatServices
from localchat.errors import UserError
from localchat.store import SessionRecord, TurnRecord, branches
from localchat.tui.screens import AskTextScreen, ConfirmScreen, ask_from_worker
from localchat.tui.sidebar import SessionRequest
from localchat.tui.tool_servers import services_registry

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def shows_user_errors(handler: F) -> F:
    """Run an async handler; a ``UserError`` it raises becomes an error notice."""

    @functools.wraps(handler)
    async def wrapper(self: Any, *args: Any) -> Any:
        try:
            return await handler(self, *args)
        except UserError as exc:
            self._app.notify(str(exc), severity="error")
            return None

    return wrapper  # type: ignore[return-value]


class Sessions:
    """The open session and the sidebar's list of them. The open session's conversation is
    ``app.conversation``, which only ``open`` and a deletion change."""

    def __init__(self, app: LocalChatApp, services_factory: Callable[..., ChatServices | None],
                 continue_last: bool, name: str | None) -> None:
        self._app = app
        self._services_factory = services_factory
        self._start = (continue_last, name)
        self.services: ChatServices | None = None  # what a conversation uses beyond the model

    async def start(self) -> None:
        """At mount: the chat services from config.toml, then the first session shown."""
        store = self._app.store
        if store.read_only:
            self._app.notify("The disk is full or read-only: your history is shown, but nothing new "
                             f"can be saved in {store.path.parent}.", title="History is read-only",
                             severity="warning", timeout=30)
        try:
            self.services = self._services_factory(ask_user=self._ask_user)
        except UserError as exc:  # a malformed config.toml: chat still works, without extras
            self._app.notify(str(exc), title="Settings not loaded", severity="error", timeout=15)
        # The tool servers come up in the background: nothing here waits for them.
        self._app.tool_servers.start(services_registry(self.services))
        await self.open(self._initial())

    def require(self) -> Conversation:
        """The open session's conversation; raises ``UserError`` when none is open."""
        if self._app.conversation is None:
            raise UserError("No session is open.")
        return self._app.conversation

    def _initial(self) -> SessionRecord:
        continue_last, name = self._start
        store = self._app.store
        if name:
            return store.resolve_session(name, create=True)
        # A read-only store cannot start a session: the last one is shown instead.
        last = store.last_session() if continue_last or store.read_only else None
        return last or store.create_session()

    def _ask_user(self, question: str) -> bool:
        """Mode "ask": offer the remote model (one key to accept), from the turn's worker thread."""
        return ask_from_worker(self._app, question, yes="Ask the remote model", no="Stay local")

    def close(self) -> None:
        """At unmount: the open conversation and the services end."""
        conversation = self._app.conversation
        if conversation is not None:
            conversation.close()
            self.discard_if_empty(conversation)  # a restart must not list it as "New chat"
        if self.services is not None:
            self.services.close()

    async def open(self, record: SessionRecord) -> None:
        """Show ``record`` and continue it with the loaded model. A reply still streaming in the
        session being left is stopped; its worker saves it (as stopped) to that session."""
        turn = self._app.turns.current
        if turn is not None:
            turn.stop()
            turn.reply = None
            self._app.turns.tools.deny_open_questions()
        await self._app.queue.drop("You left the session they were typed in.")
        self._app.draft.cancel()
        previous = self._app.conversation
        if previous is not None:
            previous.close()
        if previous is not None and previous.session_id != record.id:
            self.discard_if_empty(previous)
        self._app.conversation = Conversation(self._app.store, record, self.services)
        if not self._app.store.read_only:  # a full disk or a read-only home: shown, not moved up
            self._app.store.touch(record.id)
        self._app.message_actions.editing = None
        turns = self._app.conversation.turns()
        await self.show_conversation()
        models = self._app.models
        if models.engine is not None:
            self._app.conversation.attach(models.engine, models.sampling)
        self.show_numbers(turns)
        self._app.prompt.border_title = record.label
        self.refresh_sidebar()

    def show_numbers(self, turns: list[TurnRecord]) -> None:
        """The status bar shows the open session: its last reply's numbers and the context it
        filled (0 for an empty or cleared one), never those of the session shown before."""
        info = self._app.status.info
        last = next((t.timings for t in reversed(turns) if t.role == "assistant" and t.timings), None)
        n_ctx = info.n_ctx  # the loaded model's, whatever model the session used before
        info.ttft_ms = info.answer_ms = info.tpot_ms = info.tokens_per_s = info.cache_n = info.prompt_n = None
        info.n_ctx_used = 0
        if last is not None:
            info.show_timings(last)
            info.n_ctx = n_ctx or info.n_ctx
        self._app.status.refresh()

    def discard_if_empty(self, conversation: Conversation) -> None:
        """Sessions the user opened and left without writing anything are not kept."""
        try:
            record = conversation.record
            if record.turn_count == 0 and not record.name and not record.system:
                self._app.store.delete_session(record.id)
        except UserError:  # already deleted, or the database is busy: nothing worth keeping was lost
            pass

    def refresh_sidebar(self) -> None:
        """Show the store's current session list and title (after any change to either)."""
        current = self._app.conversation.session_id if self._app.conversation else None
        try:
            if self._app.sidebar.display:
                # Empty sessions left by a crash or another window are not worth a line.
                sessions = [r for r in self._app.store.list_sessions()
                            if r.turn_count or r.name or r.system or r.id == current]
                self._app.sidebar.show(sessions, current)
            if self._app.conversation is not None:
                self._app.prompt.border_title = self._app.conversation.record.label
        except UserError as exc:  # the database is locked by another process or unreadable
            self._app.notify(str(exc), severity="error")

    def toggle_sidebar(self) -> None:
        self._app.sidebar.display = not self._app.sidebar.display
        if self._app.sidebar.display:
            self.refresh_sidebar()
            self._app.sidebar.sessions.focus()
        else:
            self._app.prompt.focus()

    @shows_user_errors
    async def new(self) -> None:
        await self.open(self._app.store.create_session())

    @shows_user_errors
    async def request(self, request: SessionRequest) -> None:
        if request.action == "leave":
            self._app.prompt.focus()
            return
        if request.action == "new":
            await self.new()
            return
        if request.session_id is None:
            return
        target = self._app.store.session(request.session_id)
        if request.action == "open":
            await self.open(target)
            self._app.prompt.focus()
        elif request.action == "rename":
            self._app.push_screen(AskTextScreen(f"Rename “{target.label}” to:", target.name or target.title),
                                  functools.partial(self._rename_session, target.id))
        elif request.action == "delete":
            self._app.push_screen(ConfirmScreen(f"Delete “{target.label}” and all its messages?", yes="Delete"),
                                  functools.partial(self._delete_session, target.id))

    @shows_user_errors
    async def _rename_session(self, session_id: int, name: str | None) -> None:
        if name:
            self._app.store.rename_session(session_id, name)
            self.refresh_sidebar()

    @shows_user_errors
    async def _delete_session(self, session_id: int, confirmed: bool | None) -> None:
        if not confirmed:
            return
        turn = self._app.turns.current
        if turn is not None and turn.conversation.session_id == session_id:
            raise UserError("That session's reply is still streaming. Press Esc first.")
        self._app.store.delete_session(session_id)
        if self.services is not None and self.services.snapshots is not None:
            self.services.snapshots.forget(session_id)
        if self._app.conversation is not None and self._app.conversation.session_id == session_id:
            self._app.conversation = None
            await self.open(self._app.store.last_session() or self._app.store.create_session())
        self.refresh_sidebar()

    async def show_conversation(self) -> None:
        """Show the open session's turns, forked prompts marked with their versions."""
        conversation = self.require()
        forks = {seq: (b.current, b.count)
                 for seq, b in branches.fork_points(self._app.store, conversation.session_id).items()}
        await self._app.chat_log.show_turns(conversation.turns(), forks)
