"""Sessions in the app: opening one (the conversation it continues, the reply, queue, draft and
edit of the session left behind ended), the sidebar and its requests (open, new, rename,
delete). How the open session shows on screen is ``session_view``'s.

Handlers called from a dialog or a message are ``@shows_user_errors``: a ``UserError`` they raise
becomes a one-line notice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from localchat.chat.conversation import Conversation
from localchat.chat.services import ChatServices
from localchat.errors import UserError
from localchat.store import SessionRecord
from localchat.tui.host import shows_user_errors
from localchat.tui.screens import AskTextScreen, ConfirmScreen, ask_from_worker
from localchat.tui.session_view import refresh_sidebar, show_conversation, show_numbers
from localchat.tui.sidebar import SessionRequest
from localchat.tui.tool_servers import services_registry

if TYPE_CHECKING:
    from localchat.tui.draft import DraftHandOver
    from localchat.tui.host import Host
    from localchat.tui.message_actions import MessageActions
    from localchat.tui.model_state import ModelState
    from localchat.tui.tool_servers import ToolServers
    from localchat.tui.turn import Turns
    from localchat.tui.typeahead import TypeAhead


class Sessions:
    """The open session and the sidebar's list of them. The open session's conversation is
    the host's ``conversation``, which only ``open`` and a deletion change."""

    def __init__(self, host: Host, services_factory: Callable[..., ChatServices | None],
                 continue_last: bool, name: str | None, *, models: ModelState, turns: Turns,
                 queue: TypeAhead, draft: DraftHandOver, message_actions: MessageActions,
                 tool_servers: ToolServers) -> None:
        self._host = host
        self._models = models
        self._turns = turns
        self._queue = queue
        self._draft = draft
        self._message_actions = message_actions
        self._tool_servers = tool_servers
        self._services_factory = services_factory
        self._start = (continue_last, name)
        self.services: ChatServices | None = None  # what a conversation uses beyond the model

    async def start(self) -> None:
        """At mount: the chat services from config.toml, then the first session shown."""
        store = self._host.store
        if store.read_only:
            self._host.notify("The disk is full or read-only: your history is shown, but nothing new "
                              f"can be saved in {store.path.parent}.", title="History is read-only",
                              severity="warning", timeout=30)
        try:
            self.services = self._services_factory(ask_user=self._ask_user)
        except UserError as exc:  # a malformed config.toml: chat still works, without extras
            self._host.notify(str(exc), title="Settings not loaded", severity="error", timeout=15)
        # The tool servers come up in the background: nothing here waits for them.
        self._tool_servers.start(services_registry(self.services))
        await self.open(self._initial())

    def _initial(self) -> SessionRecord:
        continue_last, name = self._start
        store = self._host.store
        if name:
            return store.resolve_session(name, create=True)
        # A read-only store cannot start a session: the last one is shown instead.
        last = store.last_session() if continue_last or store.read_only else None
        return last or store.create_session()

    def _ask_user(self, question: str) -> bool:
        """Mode "ask": offer the remote model (one key to accept), from the turn's worker thread."""
        return ask_from_worker(self._host, question, yes="Ask the remote model", no="Stay local")

    def close(self) -> None:
        """At unmount: the open conversation and the services end."""
        conversation = self._host.conversation
        if conversation is not None:
            conversation.close()
            self.discard_if_empty(conversation)  # a restart must not list it as "New chat"
        if self.services is not None:
            self.services.close()

    async def open(self, record: SessionRecord) -> None:
        """Show ``record`` and continue it with the loaded model. A reply still streaming in the
        session being left is stopped; its worker saves it (as stopped) to that session."""
        turn = self._turns.current
        if turn is not None:
            turn.stop()
            turn.reply = None
            self._turns.tools.deny_open_questions()
        await self._queue.drop("You left the session they were typed in.")
        self._draft.cancel()
        previous = self._host.conversation
        if previous is not None:
            previous.close()
        if previous is not None and previous.session_id != record.id:
            self.discard_if_empty(previous)
        self._host.conversation = Conversation(self._host.store, record, self.services)
        if not self._host.store.read_only:  # a full disk or a read-only home: shown, not moved up
            self._host.store.touch(record.id)
        self._message_actions.editing = None
        turns = self._host.conversation.turns()
        await show_conversation(self._host)
        models = self._models
        if models.engine is not None:
            self._host.conversation.attach(models.engine, models.sampling)
        show_numbers(self._host, turns)
        self._host.prompt.border_title = record.label
        refresh_sidebar(self._host)

    def discard_if_empty(self, conversation: Conversation) -> None:
        """Sessions the user opened and left without writing anything are not kept."""
        try:
            record = conversation.record
            if record.turn_count == 0 and not record.name and not record.system:
                self._host.store.delete_session(record.id)
        except UserError:  # already deleted, or the database is busy: nothing worth keeping was lost
            pass

    def toggle_sidebar(self) -> None:
        self._host.sidebar.display = not self._host.sidebar.display
        if self._host.sidebar.display:
            refresh_sidebar(self._host)
            self._host.sidebar.sessions.focus()
        else:
            self._host.prompt.focus()

    @shows_user_errors
    async def new(self) -> None:
        await self.open(self._host.store.create_session())

    @shows_user_errors
    async def request(self, request: SessionRequest) -> None:
        if request.action == "leave":
            self._host.prompt.focus()
            return
        if request.action == "new":
            await self.new()
            return
        if request.session_id is None:
            return
        target = self._host.store.session(request.session_id)
        if request.action == "open":
            await self.open(target)
            self._host.prompt.focus()
        elif request.action == "rename":
            self._host.push_screen(AskTextScreen(f"Rename “{target.label}” to:", target.name or target.title),
                                   functools.partial(self._rename_session, target.id))
        elif request.action == "delete":
            self._host.push_screen(ConfirmScreen(f"Delete “{target.label}” and all its messages?", yes="Delete"),
                                   functools.partial(self._delete_session, target.id))

    @shows_user_errors
    async def _rename_session(self, session_id: int, name: str | None) -> None:
        if name:
            self._host.store.rename_session(session_id, name)
            refresh_sidebar(self._host)

    @shows_user_errors
    async def _delete_session(self, session_id: int, confirmed: bool | None) -> None:
        if not confirmed:
            return
        turn = self._turns.current
        if turn is not None and turn.conversation.session_id == session_id:
            raise UserError("That session's reply is still streaming. Press Esc first.")
        self._host.store.delete_session(session_id)
        if self.services is not None and self.services.snapshots is not None:
            self.services.snapshots.forget(session_id)
        if self._host.conversation is not None and self._host.conversation.session_id == session_id:
            self._host.conversation = None
            await self.open(self._host.store.last_session() or self._host.store.create_session())
        refresh_sidebar(self._host)
