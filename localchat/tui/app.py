"""The localchat app: a chat log streaming Markdown, a prompt, a live status bar, sessions.

``LocalChatApp`` keeps the layout, the key bindings, mounting and unmounting, and the routing of
Textual's messages and actions to the parts that own the app's state (listed in the package's
docstring, ``localchat.tui``), each with all its state set in its own ``__init__``. It is the one
place that knows all parts: it builds them, hands each the siblings it uses, and is their
``host.Host``; what one part's event means for another (a model ready sends the queue, Esc ends
an edit or a queued message before the reply) is decided here.

Threads: the UI thread only renders and reacts. Loading a model and running a turn happen in
thread workers that report through typed messages (``localchat.tui.messages``).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import Notification, Notify
from textual.screen import Screen
from textual.widgets import Footer

from localchat.chat.conversation import Conversation
from localchat.chat.services import ChatServices, build_services
from localchat.ending import detach_lost_terminal, exit_status
from localchat.errors import UserError
from localchat.store import Store
from localchat.tui import clipboard
from localchat.tui.app_engine import EngineFactory
from localchat.tui.attached_files import AttachedFiles, AttachmentChips
from localchat.tui.chat_log import ChatLog
from localchat.tui.composer import Composer
from localchat.tui.download import Downloads, ModelDownloads, RegistryDownloads
from localchat.tui.draft import DraftHandOver
from localchat.tui.engine_factories import build_engine, default_sampling, model_choices
from localchat.tui.message_actions import MessageActions
from localchat.tui.messages import (
    ModelFailed,
    ModelLoading,
    ModelReady,
    SessionChanged,
    TurnsArrived,
    TurnWake,
)
from localchat.tui.model_state import ModelState
from localchat.tui.prompt import CommandHints, PromptInput
from localchat.tui.session_view import refresh_sidebar
from localchat.tui.sessions import SessionRequest, Sessions
from localchat.tui.sidebar import SessionSidebar
from localchat.tui.slash_commands import Commands
from localchat.tui.status import StatusBar
from localchat.tui.tool_servers import ToolServerChanged, ToolServers
from localchat.tui.turn import Turns
from localchat.tui.typeahead import TypeAhead

if TYPE_CHECKING:
    from textual.driver import Driver

    from localchat.engine.options import Sampling


def terminal_driver_class() -> type[Driver] | None:
    """The driver that survives a closed terminal, where Textual would use its LinuxDriver
    (not on Windows, nor when TEXTUAL_DRIVER names another)."""
    if sys.platform == "win32" or os.environ.get("TEXTUAL_DRIVER"):
        return None
    from localchat.tui.terminal_driver import TerminalDriver  # termios: not on Windows

    return TerminalDriver

class LocalChatApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "localchat"
    BINDINGS = [
        Binding("escape", "stop_reply", "Stop"),
        Binding("ctrl+c", "interrupt", "Stop/Quit", show=False, priority=True),
        Binding("ctrl+n", "new_session", "New"),
        Binding("ctrl+b", "toggle_sidebar", "Sessions"),
        Binding("ctrl+t", "toggle_thinking", "Thinking", show=False),
        Binding("alt+up,ctrl+up", "select_messages", "Select message", show=False, priority=True),
        Binding("ctrl+e", "external_editor", "$EDITOR", show=False, priority=True),
        Binding("f1", "help", "Help"),
        Binding("question_mark", "help", "Help", show=False),
    ]

    def __init__(
        self,
        *,
        store: Store,
        model: str | None = None,
        continue_last: bool = False,
        session: str | None = None,
        engine_factory: EngineFactory = build_engine,
        sampling_factory: Callable[[], Sampling | None] = default_sampling,
        list_models: Callable[[], list[tuple[str, bool]]] = model_choices,
        services_factory: Callable[..., ChatServices | None] = build_services,
        downloads: Downloads | None = None,
    ) -> None:
        super().__init__(driver_class=terminal_driver_class())
        self.store = store
        self.conversation: Conversation | None = None  # the open session's (see ``Sessions.open``)
        self._notices_by_cause: dict[str, list[Notification]] = {}
        self._hung_up = False  # SIGHUP (or its driver's failed write) was heard: quitting already
        # The parts, each given the siblings it uses (``host.Host`` is what they ask of the app).
        self.models = ModelState(self, model, engine_factory, sampling_factory)
        self.downloads = ModelDownloads(self, downloads or RegistryDownloads(), self.models.load)
        self.queue = TypeAhead(self)
        self.files = AttachedFiles(self, self.models)
        self.draft = DraftHandOver(self, self.files, busy=self._message_on_its_way)
        self.turns = Turns(self, self.models, self.queue, self.draft)
        self.message_actions = MessageActions(self, self.turns, self.queue)
        self.tool_servers = ToolServers(self)
        self.sessions = Sessions(self, services_factory, continue_last, session, models=self.models,
                                 turns=self.turns, queue=self.queue, draft=self.draft,
                                 message_actions=self.message_actions, tool_servers=self.tool_servers)
        self.commands = Commands(self, sessions=self.sessions, models=self.models, turns=self.turns,
                                 message_actions=self.message_actions, tool_servers=self.tool_servers,
                                 files=self.files, draft=self.draft)
        self.composer = Composer(self, list_models, commands=self.commands, files=self.files,
                                 draft=self.draft, turns=self.turns, message_actions=self.message_actions)

    def _message_on_its_way(self) -> bool:
        """A reply streams or typed-ahead messages wait: the draft in the input is not next."""
        return self.turns.current is not None or bool(self.queue.items)

    # --- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # The prompt, status bar and footer each sit in a container of their own: Textual renders
        # every widget whose container overlaps a repaint, so beside the log they were drawn again
        # on each frame of a streaming reply (~15% of a frame's UI time).
        with Horizontal(id="main"):
            yield SessionSidebar(id="sidebar")
            with Vertical(id="chat"):
                yield ChatLog(id="log", stored_pictures=self.store.image_bytes)
                with Vertical(id="composer"):
                    yield CommandHints(id="hints", markup=False)
                    yield AttachmentChips(id="attachments", markup=False)
                    yield PromptInput(self.store.recent_prompts(), self.composer.completions,
                                      take_paste=self.composer.take_paste, id="prompt")
        with Vertical(id="bottom"):
            yield StatusBar(id="status")
            yield Footer()

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one("#log", ChatLog)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one("#status", StatusBar)

    @property
    def sidebar(self) -> SessionSidebar:
        return self.query_one("#sidebar", SessionSidebar)

    async def on_mount(self) -> None:
        self.turns.start()
        self.chat_log.show_thinking = self.store.get_setting("show_thinking") == "yes"
        saved_theme = self.store.get_setting("theme")
        if saved_theme in self.available_themes:
            self.theme = saved_theme
        self.theme_changed_signal.subscribe(self, lambda theme: self.save_setting("theme", theme.name))
        await self.sessions.start()
        self.prompt.focus()
        self.composer.fetch_model_names()
        self.models.load(self.models.loaded_ref)

    def save_setting(self, key: str, value: str) -> None:
        """Remember a display choice; on a full disk or read-only store, a notice instead."""
        try:
            self.store.set_setting(key, value)
        except UserError as exc:  # a full disk: the choice holds until the app closes
            self.notify(str(exc), severity="warning")

    @property
    def closed(self) -> bool:
        """Unmounted: workers still running must not touch the app."""
        return self._closed

    def set_state(self, state: str) -> None:
        self.status.info.state = state
        self.status.refresh()

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = False, cause: str = "") -> None:
        """Toasts show plain text: error messages and names carry brackets such as [remote]
        that Textual would otherwise read as markup. A toast with a ``cause`` ("model", "turn")
        is withdrawn by ``withdraw_notices`` when that cause is gone (the model loaded, a turn
        succeeded), instead of lingering for its whole timeout."""
        notification = Notification(message, title, severity,  # type: ignore[arg-type]
                                    self.NOTIFICATION_TIMEOUT if timeout is None else timeout, markup=markup)
        if cause:
            self._notices_by_cause.setdefault(cause, []).append(notification)
        self.post_message(Notify(notification))

    def copy_text(self, text: str) -> None:
        """Copy ``text`` out of the app (OSC 52, then a fallback that says where it went)."""
        clipboard.copy_text(self, text)

    def withdraw_notices(self, cause: str) -> None:
        for notification in self._notices_by_cause.pop(cause, []):
            if notification in self._notifications:
                self._unnotify(notification)

    # --- messages ---------------------------------------------------------------------------

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        await self.composer.submit(message.text)

    def on_text_area_changed(self, event: PromptInput.Changed) -> None:
        self.composer.changed(event.text_area.text)

    def on_prompt_input_empty_backspace(self, message: PromptInput.EmptyBackspace) -> None:
        self.composer.remove_last_image()

    def on_prompt_input_page_key(self, message: PromptInput.PageKey) -> None:
        log_view = self.chat_log
        log_view.scroll_page_up() if message.direction < 0 else log_view.scroll_page_down()

    async def on_chat_log_action(self, event: ChatLog.Action) -> None:
        await self.message_actions.act(event)

    async def on_session_request(self, request: SessionRequest) -> None:
        await self.sessions.request(request)

    def on_session_changed(self, message: SessionChanged) -> None:
        refresh_sidebar(self)

    async def on_turns_arrived(self, message: TurnsArrived) -> None:
        await self.turns.show_arrived(message)

    async def on_turn_wake(self, message: TurnWake) -> None:
        await self.turns.wake(message)

    def on_tool_server_changed(self, message: ToolServerChanged) -> None:
        self.tool_servers.show(message.status)

    def on_model_loading(self, message: ModelLoading) -> None:
        self.models.show_progress(message)

    async def on_model_ready(self, message: ModelReady) -> None:
        await self.models.ready(message)
        await self.turns.send_queued()

    async def on_model_failed(self, message: ModelFailed) -> None:
        if not self.models.failed(message):  # the model in use (or the one coming back) stays
            return
        if self.downloads.offer(message.model_ref):  # not downloaded: offered here, no need to quit
            return
        await self.queue.drop("No model is loaded, so it was not sent.")
        await self.models.show_unloaded(message)

    # --- actions ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop_reply":
            busy = self.turns.current is not None or self.queue.items or self.message_actions.editing is not None
            return True if busy else None  # greyed in the footer when idle
        return True

    async def action_stop_reply(self) -> None:
        """Esc: cancel an edit, or take back the newest queued message, else stop the reply."""
        if self.message_actions.editing is not None:
            self.message_actions.cancel_edit()
        elif self.queue.items:
            await self.queue.remove_last()
        else:
            self.turns.stop()

    def action_interrupt(self) -> None:
        self.turns.interrupt()

    async def action_quit(self) -> None:
        await self.turns.quit()

    def end_on_signal(self, signum: int) -> None:
        """SIGTERM or SIGHUP (``localchat.ending``; the driver reports a terminal that hung up
        as SIGHUP too): quit as Ctrl+Q does, with the status the signal gives; a terminal that
        hung up is let go first. A SIGINT sent from outside is the Ctrl+C key (in the app, the
        key sends none)."""
        if signum == signal.SIGINT:
            self.call_later(self.action_interrupt)
            return
        if signum == getattr(signal, "SIGHUP", None):
            if self._hung_up:  # the driver saw the terminal go (a failed write) before the signal
                return
            self._hung_up = True
        if detach_lost_terminal():
            stop_reading = getattr(self._driver, "stop_reading", None)
            if stop_reading is not None:
                stop_reading()
        self.call_later(self.turns.quit, exit_status(signum))

    async def action_new_session(self) -> None:
        await self.sessions.new()

    def action_toggle_sidebar(self) -> None:
        self.sessions.toggle_sidebar()

    def action_toggle_thinking(self) -> None:
        self.message_actions.toggle_thinking()

    def action_select_messages(self) -> None:
        self.message_actions.select_messages()

    def action_external_editor(self) -> None:
        self.message_actions.external_editor()

    def action_help(self) -> None:
        self.commands.show_help()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from self.commands.palette()

    def on_unmount(self) -> None:
        # Textual's own flag, set before Textual would: messages that workers still post (a
        # model's load progress) are dropped instead of reaching widgets that are gone.
        self._closed = True
        self.draft.cancel()
        self.sessions.close()
        self.turns.close()
        self.models.close()
