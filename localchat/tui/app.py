"""The localchat app: a chat log streaming Markdown, a prompt, a live status bar, sessions.

Threads: the UI thread only renders and reacts. Loading a model and running a turn happen in
thread workers that report through typed messages (``localchat.tui.messages``); the generation
worker also commits the finished reply to the store before the UI hears that it is done, so
the screen never shows as saved what is not.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import Notification
from textual.widgets import Footer

from localchat import logs
from localchat.attachments import Attachment
from localchat.chat.conversation import Conversation
from localchat.chat.services import ChatServices, build_services
from localchat.errors import UserError
from localchat.events import Done, Event, Failed, Notice, PrefillProgress, RouteChanged
from localchat.store import SessionRecord, Store
from localchat.tui import slash
from localchat.tui.attach import AttachmentChips, Attachments
from localchat.tui.chat_log import ChatLog, reply_caption
from localchat.tui.download import Downloads, ModelDownloads, RegistryDownloads
from localchat.tui.draft import DraftPrefiller
from localchat.tui.input_actions import InputActions, Notices
from localchat.tui.message_actions import MessageActions
from localchat.tui.messages import (
    SessionChanged,
    ThinkingRun,
    TokenRun,
    TurnMailbox,
    TurnsArrived,
    TurnWake,
)
from localchat.tui.model_loading import ModelLoader
from localchat.tui.model_setup import build_engine, default_sampling, model_choices
from localchat.tui.pacing import FramePacer
from localchat.tui.prompt import CommandHints, PromptInput
from localchat.tui.screens import ConfirmScreen
from localchat.tui.session_actions import SessionActions
from localchat.tui.shutdown import exit_now, run_until_quit
from localchat.tui.sidebar import SessionSidebar
from localchat.tui.status import LiveMeter, StatusBar
from localchat.tui.turn import ActiveTurn
from localchat.tui.typeahead import Queued, TypeAhead

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling

log = logging.getLogger(__name__)

EngineFactory = Callable[[str | None], "Engine"]

GIL_SWITCH_INTERVAL_S = 0.001


class LocalChatApp(SessionActions, MessageActions, Attachments, ModelLoader, ModelDownloads, TypeAhead, DraftPrefiller, InputActions, Notices,
                   App[int]):
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
        super().__init__()
        self._downloads = downloads or RegistryDownloads()
        self._services_factory = services_factory
        self.services: ChatServices | None = None
        self.store = store
        self.model_ref = model
        self._start = (continue_last, session)
        self._engine_factory = engine_factory
        self._sampling_factory = sampling_factory
        self.sampling: Sampling | None = None
        self.thinking_mode = ""  # set by /think; "" = the config's [sampling] thinking
        self._list_models = list_models
        self._model_choices: list[tuple[str, bool]] = []
        self.engine: Engine | None = None
        self.model_ref_loaded = model  # what the loaded model was called (reloaded if a switch fails)
        self.queued: list[Queued] = []  # type-ahead, oldest first
        self.attachments: list[Attachment] = []  # files going with the next message
        self._typing_model = False  # the input starts with /model (model names are re-read)
        self._notices_by_cause: dict[str, list[Notification]] = {}
        self.loading_model: str | None = None
        self.model_error = ""
        self.conversation: Conversation | None = None
        self._turn: ActiveTurn | None = None
        self._turn_ids = itertools.count(1)
        self._quit_when_idle = False
        self._closed = False
        self._pacer = FramePacer()
        self._previous_switch_interval = sys.getswitchinterval()

    # --- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield SessionSidebar(id="sidebar")
            with Vertical(id="chat"):
                yield ChatLog(id="log")
                yield CommandHints(id="hints", markup=False)
                yield AttachmentChips(id="attachments", markup=False)
                yield PromptInput(self.store.recent_prompts(), self._completions, id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def sidebar(self) -> SessionSidebar:
        return self.query_one(SessionSidebar)

    async def on_mount(self) -> None:
        # The engine thread needs the GIL back after every llama_decode; with Python's default 5 ms
        # switch interval a redrawing UI thread could hold it that long per token.
        self._previous_switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.chat_log.show_thinking = self.store.get_setting("show_thinking") == "yes"
        saved_theme = self.store.get_setting("theme")
        if saved_theme in self.available_themes:
            self.theme = saved_theme
        self.theme_changed_signal.subscribe(self, lambda theme: self._save_setting("theme", theme.name))
        if self.store.read_only:
            self.notify("The disk is full or read-only: your history is shown, but nothing new "
                        f"can be saved in {self.store.path.parent}.", title="History is read-only",
                        severity="warning", timeout=30)
        self.prompt.border_subtitle = "Enter send · Ctrl+J newline · PgUp/PgDn scroll · F1 help"
        try:
            self.services = self._services_factory(ask_user=self._ask_user)
        except UserError as exc:  # a malformed config.toml: chat still works, without extras
            self.notify(str(exc), title="Settings not loaded", severity="error", timeout=15)
        await self.open_session(self._initial_session())
        self.prompt.focus()
        self._fetch_model_names()
        self.load_model(self.model_ref)

    def _initial_session(self) -> SessionRecord:
        continue_last, name = self._start
        if name:
            return self.store.resolve_session(name, create=True)
        # A read-only store cannot start a session: the last one is shown instead.
        last = self.store.last_session() if continue_last or self.store.read_only else None
        return last or self.store.create_session()

    def _save_setting(self, key: str, value: str) -> None:
        try:
            self.store.set_setting(key, value)
        except UserError as exc:  # a full disk: the choice holds until the app closes
            self.notify(str(exc), severity="warning")

    def set_state(self, state: str) -> None:
        self.status.info.state = state
        self.status.refresh()

    @property
    def turn(self) -> ActiveTurn | None:
        """The reply being generated, if any."""
        return self._turn

    @turn.setter
    def turn(self, turn: ActiveTurn | None) -> None:
        # Only here: refreshing bindings re-renders the footer, too costly to do per update.
        if (turn is None) != (self._turn is None):
            self._turn = turn
            self.refresh_bindings()  # the footer's Stop key is live only while a reply runs
        self._turn = turn

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop_reply":
            busy = self.turn is not None or self.queued or self.editing is not None
            return True if busy else None  # greyed in the footer when idle
        return True

    # --- sending and streaming --------------------------------------------------------------

    def _ready_for_a_turn(self) -> bool:
        """Whether a prompt can be sent now; if not, say why (the prompt stays in the input)."""
        if self.turn is not None:
            self.notify("A reply is still streaming. Press Esc to stop it first.", severity="warning")
        elif self.engine is None:
            why = (f"The model is still loading ({self.status.info.state})." if self.loading_model
                   else f"No model is loaded: {self.model_error}")
            self.notify(why + " Your message stays in the input.", severity="warning")
        else:
            return True
        return False

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if slash.is_command(text):
            if " " in text.strip():  # "/model qwen" is worth recalling; a bare "/retry" is not
                self.prompt.remember(text)
            self.prompt.clear()
            await self.run_slash_command(text)
        else:
            typed = text[1:] if text.startswith("//") else text
            try:
                text = await self.message_with_files(typed)
            except UserError as exc:  # the message stays in the input
                self.notify(str(exc), severity="error")
                return
            if self.editing is not None:
                await self.send_edited(text)
            else:
                await self.send_prompt(text, recall=typed)

    def _ask_user(self, question: str) -> bool:
        """Mode "ask": offer the remote model (one key to accept). Runs on the turn's worker
        thread and waits for the answer while the UI stays live."""
        import threading

        answered, answer = threading.Event(), []

        def record(choice: bool | None) -> None:
            answer.append(bool(choice))
            answered.set()

        self.call_from_thread(self.push_screen,
                              ConfirmScreen(question, yes="Ask the remote model", no="Stay local"), record)
        answered.wait()
        return answer[0]

    async def send_prompt(self, text: str, route: str = "auto", *, queued: bool = False,
                          recall: str | None = None) -> None:
        """Send ``text`` now, or queue it (type-ahead) while a reply streams or the model loads.
        With no model and none loading it stays in the input, with a notice saying why.
        ``recall``: what Up brings back (the typed text, without attached files)."""
        recall = text if recall is None else recall
        if self.conversation is None:
            return
        if not queued and self.must_queue():
            self.prompt.remember(recall)
            self.prompt.clear()
            await self.queue_message(text, route)
            return
        if not self._ready_for_a_turn():
            return
        assert self.engine is not None  # checked by _ready_for_a_turn
        if not queued:
            self.prompt.remember(recall)
            self.prompt.clear()
        self.cancel_draft_prefill()
        turn_id = next(self._turn_ids)

        def wake() -> None:
            self.post_message(TurnWake(turn_id))

        mailbox = TurnMailbox(wake)
        turn = ActiveTurn(turn_id, self.conversation, None, mailbox, LiveMeter(),
                          context_before=self.status.info.n_ctx_used)
        self.turn = turn
        self.set_state("prefilling")
        # The model starts first: mounting the prompt and its empty reply takes tens of ms of UI
        # time, which prefill overlaps (no event is shown before this handler returns).
        self._generate(turn, text, self.engine.name, route)
        await asyncio.sleep(0)  # lets the worker's task hand the turn to its thread now
        turn.reply = await self.chat_log.add_prompt(text)

    @work(thread=True, group="turn", exit_on_error=False)
    def _generate(self, turn: ActiveTurn, text: str, model: str, route: str = "auto") -> None:
        try:
            with turn.conversation.turn_lock() as arrived:
                if arrived:  # before any event of this turn: shown above its prompt
                    self.post_message(TurnsArrived(turn.id, arrived))
                turn.handle = turn.conversation.send(text, route)
                for notice in turn.conversation.take_notices():
                    turn.mailbox.put(notice)
                if turn.stop_requested:
                    turn.handle.stop()
                self.post_message(SessionChanged())  # the first prompt gives the session its title
                for event in turn.handle:
                    if isinstance(event, Done):
                        turn.conversation.record_reply(event, model)
                    turn.mailbox.put(event)
        except UserError as exc:
            turn.mailbox.put(Failed(str(exc)))
        except Exception as exc:  # a store or engine bug must still end the turn on screen
            log.exception("turn failed")
            turn.mailbox.put(Failed(f"{type(exc).__name__}: {exc}"))

    def on_session_changed(self, message: SessionChanged) -> None:
        self.refresh_sidebar()

    async def on_turns_arrived(self, message: TurnsArrived) -> None:
        turn = self.turn
        if turn is not None and turn.id == message.turn_id and turn.reply is not None:
            await self.chat_log.add_turns_before_prompt(message.turns, turn.reply)

    async def on_turn_wake(self, message: TurnWake) -> None:
        turn = self.turn
        if turn is None or message.turn_id != turn.id:
            return
        # The first token is never held back: TTFT is what the user feels most.
        wait = self._pacer.wait() if turn.meter.first_token_at is not None else 0.0
        if wait > 0:
            self.set_timer(wait, lambda: self._show_turn_events(turn))
        else:
            await self._show_turn_events(turn)

    async def _show_turn_events(self, turn: ActiveTurn) -> None:
        if turn is not self.turn:
            return
        if turn.meter.first_token_at is None:
            # Until the first token, the UI's CPU went to adding the prompt and prefill progress,
            # not to streaming: it must not stretch the frames that follow.
            self._pacer.start()
        self._pacer.frame()
        for event in turn.mailbox.take():
            await self._show_turn_event(turn, event)

    async def _show_turn_event(self, turn: ActiveTurn, event: Event | TokenRun | ThinkingRun) -> None:
        if isinstance(event, TokenRun | ThinkingRun | PrefillProgress):
            await turn.show_progress(event, self.status.info)
            self.status.refresh()
        elif isinstance(event, RouteChanged):
            if turn.reply is not None:
                await (turn.reply.supersede(event.message) if event.route == "remote"
                       else turn.reply.unsupersede())
            self.notify(event.message)
        elif isinstance(event, Notice):
            self.notify(event.message, severity="warning" if event.kind == "warning" else "information")
        elif isinstance(event, Done):
            await self._finish_turn(turn, event)
        elif isinstance(event, Failed):
            await self._fail_turn(turn, event)

    async def _finish_turn(self, turn: ActiveTurn, done: Done) -> None:
        self.turn = None
        stopped = done.finish_reason == "aborted"
        self.status.info.show_timings(done.timings)
        self.set_state("stopped" if stopped else "idle")
        if turn.reply is not None:
            model = done.timings.model or self.status.info.model
            await turn.reply.finish(done.answer, reply_caption(model, done.timings, stopped=stopped),
                                    stopped=stopped, thinking=done.thinking, timings=done.timings)
        if done.finish_reason == "length":
            self.notify("The reply reached the max_tokens limit.", severity="warning")
        if not stopped:
            self.withdraw_notices("turn")  # an earlier failure no longer applies
        await self._after_turn()

    async def _fail_turn(self, turn: ActiveTurn, failed: Failed) -> None:
        self.turn = None
        self.set_state("idle")
        if turn.reply is not None:
            await turn.reply.fail(failed.message)
        self.notify(failed.message, title="The reply failed", severity="error", timeout=10, cause="turn")
        await self._after_turn()

    async def _after_turn(self) -> None:
        self.refresh_sidebar()
        if self._quit_when_idle:
            self.exit(0)
            return
        await self.send_next_queued()
        if self.turn is None and self.prompt.text:
            self.schedule_draft_prefill(self.prompt.text)  # typed while the reply streamed

    # --- stopping and quitting --------------------------------------------------------------

    async def action_stop_reply(self) -> None:
        """Esc: cancel an edit, or take back the newest queued message, else stop the reply."""
        if self.editing is not None:
            self.cancel_edit()
        elif self.queued:
            await self.remove_last_queued()
        else:
            self._stop_turn()

    def _stop_turn(self) -> None:
        if self.turn is not None:
            self.turn.stop()
            self.set_state("stopping")

    def action_interrupt(self) -> None:
        """Ctrl+C: stop a streaming reply; when idle, ask before quitting."""
        if self.turn is not None:
            self._stop_turn()
        elif isinstance(self.screen, ConfirmScreen):
            self.screen.dismiss(True)
        elif isinstance(self.focused, PromptInput) and self.focused.selected_text:
            self.copy_to_clipboard(self.focused.selected_text)
        else:
            self.push_screen(ConfirmScreen("Quit localchat?", yes="Quit"), self._quit_if)

    async def _quit_if(self, confirmed: bool | None) -> None:
        if confirmed:
            await self.action_quit()

    async def action_quit(self) -> None:
        """Quit; a streaming reply is stopped first so that it is saved (as stopped)."""
        if self.turn is None:
            self.exit(0)
            return
        self._quit_when_idle = True
        self._stop_turn()

    def on_unmount(self) -> None:
        self._closed = True
        self.cancel_draft_prefill()
        if self.conversation is not None:
            self.conversation.close()
            self._discard_if_empty(self.conversation)  # a restart must not list it as "New chat"
        if self.services is not None:
            self.services.close()
        sys.setswitchinterval(self._previous_switch_interval)
        if self.engine is not None:
            self.engine.close()


def run_app(model: str | None = None, continue_last: bool = False, session: str | None = None) -> int:
    """Open the app (``localchat`` with no sub-command). Returns the exit status.

    Raises ``UserError`` (shown by the CLI as one line) when the session database cannot be used.
    """
    with _open_store() as store:
        if session:
            store.resolve_session(session, create=True)  # an unknown id: one line, before the window opens
        logs.attach()  # the app's own failures (a turn, a model load) keep their tracebacks too
        app = LocalChatApp(store=store, model=model, continue_last=continue_last, session=session)
        code, stuck = run_until_quit(app)
    if stuck:  # a worker that never returns must not keep the process alive after a quit
        exit_now(code)
    return code


def _open_store() -> Store:
    """The session store; on a full disk or in a read-only home, opened read-only, so that the
    history can still be read (the app says so; a turn then fails to save with its notice)."""
    from localchat.paths import database_file
    from localchat.store.connect import StoreError, unwritable

    try:
        return Store.open()
    except StoreError:
        path = database_file()
        if not (path.is_file() and unwritable(path)):
            raise
        store = Store.open(read_only=True)  # an older schema needs writes: raises again
        if store.last_session() is None:  # nothing to read, and no session can be started
            store.close()
            raise
        return store
