"""The reply being generated: ``ActiveTurn``, shared between the UI and the worker thread that
runs it, and ``Turns``, the app's side of sending, streaming and stopping it."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.chat.conversation import Conversation
from localchat.errors import UserError
from localchat.events import (
    Done,
    Event,
    Failed,
    Notice,
    PrefillProgress,
    RouteChanged,
    ToolApproval,
    ToolCalled,
    ToolReturned,
)
from localchat.tui.messages import (
    SessionChanged,
    ThinkingRun,
    TokenRun,
    ToolRoundDone,
    TurnMailbox,
    TurnsArrived,
    TurnWake,
)
from localchat.tui.pacing import FramePacer, FullCollectionsPaused, route_budget
from localchat.tui.prompt import PromptInput
from localchat.tui.reply_view import ReplyView, reply_caption
from localchat.tui.screens import ConfirmScreen
from localchat.tui.session_view import refresh_sidebar
from localchat.tui.status import LiveMeter, StatusInfo
from localchat.tui.tool_events import ToolActivity

if TYPE_CHECKING:
    from localchat.events import Turn
    from localchat.formats import AnswerFormat
    from localchat.store.images import ImageFile
    from localchat.tui.draft import DraftHandOver
    from localchat.tui.host import Host
    from localchat.tui.model_state import ModelState
    from localchat.tui.typeahead import TypeAhead

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL_S = 0.001
# The live numbers in the status bar are read, not watched: repainting them on every frame cost
# ~1.5 ms of UI time per frame and widened each frame's repaint from the reply's last line to
# the bottom of the screen. Twice a second: every repaint is UI time the pacer takes from the
# frames (at 4 a second the one-paragraph bench shape drew ~10% fewer frames).
STATUS_REFRESH_S = 0.5


@dataclass
class ActiveTurn:
    """One running reply. The worker sets ``handle`` and fills ``mailbox``; the UI sets
    ``stop_requested`` and shows what arrives. Each side checks the other's field after setting
    its own, so a stop pressed before the turn has started is never lost."""

    id: int
    conversation: Conversation
    reply: ReplyView | None  # None once the user switched away from its session
    mailbox: TurnMailbox
    meter: LiveMeter
    context_before: int = 0  # tokens in context when the turn started (for the live estimate)
    prefill_total: int = 0
    shape: AnswerFormat | None = None  # /format's when it was sent: its answer is checked
    handle: Turn | None = None
    stop_requested: bool = False

    def stop(self) -> None:
        self.stop_requested = True
        if self.handle is not None:
            self.handle.stop()

    async def show_progress(self, event: TokenRun | ThinkingRun | PrefillProgress, info: StatusInfo) -> None:
        """Show new reply text (reasoning or answer) or prefill progress, and the live numbers."""
        if isinstance(event, PrefillProgress):
            self.prefill_total = event.total
            info.state = f"prefilling {event.done}/{event.total}"
            return
        self.meter.token(event.count)
        thinking = isinstance(event, ThinkingRun)
        info.state = "thinking" if thinking else "generating"
        self.meter.apply(info)
        # Trimming may lower it: Done brings the engine's count.
        info.estimate_context(self.context_before + self.prefill_total + self.meter.tokens)
        if event.text and self.reply is not None:
            await (self.reply.think(event.text) if thinking else self.reply.append(event.text))


class Turns:
    """The turn in flight: sending a message (or queueing it in ``queue`` while a reply streams
    or the model loads, and sending the oldest when the engine is free), running it on a worker
    thread, showing its events as they arrive (paced to the frame rate), and stopping it. At
    most one runs at a time.

    Threads: the generation worker also commits the finished reply to the store before the UI
    hears that it is done, so the screen never shows as saved what is not.
    """

    def __init__(self, host: Host, models: ModelState, queue: TypeAhead, draft: DraftHandOver) -> None:
        self._host = host
        self._models = models
        self._queue = queue
        self._draft = draft
        self._current: ActiveTurn | None = None
        self._ids = itertools.count(1)
        self.pacer = FramePacer()
        self.collections = FullCollectionsPaused()
        self.quit_when_idle = False  # the user quit while a reply streamed: exit once it is saved
        self._quit_status = 0  # the exit status of that quit (a signal's: localchat.ending)
        self._previous_switch_interval = sys.getswitchinterval()
        self._status_shown_at = 0.0
        self.tools = ToolActivity(host)
        # A frame's events are shown by the wake handler or, when it waits for the next frame,
        # by a timer, whose callback Textual runs in a task of its own: without the lock two
        # showings could interleave at their awaits (a call's result handled before its line
        # was mounted, and lost).
        self._showing = asyncio.Lock()

    def start(self) -> None:
        """At mount. The engine thread needs the GIL back after every llama_decode; with Python's
        default 5 ms switch interval a redrawing UI thread could hold it that long per token."""
        self._previous_switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    def close(self) -> None:
        """At unmount: the process's switch interval and collector as they were."""
        sys.setswitchinterval(self._previous_switch_interval)
        self.collections.resume()

    @property
    def current(self) -> ActiveTurn | None:
        """The reply being generated, if any."""
        return self._current

    @current.setter
    def current(self, turn: ActiveTurn | None) -> None:
        # Only here: refreshing bindings re-renders the footer, too costly to do per update.
        if (turn is None) != (self._current is None):
            self._current = turn
            self._host.refresh_bindings()  # the footer's Stop key is live only while a reply runs
            self._steady_cursor(turn is not None)
            if turn is None:
                self.collections.resume()
            else:
                self.collections.pause()
        self._current = turn

    def _steady_cursor(self, streaming: bool) -> None:
        """The prompt's cursor stops blinking while a reply streams: each blink repaints its line
        (~3 ms of UI time, twice a second), time the pacer would take from the reply's frames."""
        self._host.prompt.cursor_blink = not streaming

    # --- sending and streaming --------------------------------------------------------------

    def ready(self) -> bool:
        """Whether a prompt can be sent now; if not, say why (the prompt stays in the input)."""
        host, models = self._host, self._models
        if self.current is not None:
            host.notify("A reply is still streaming. Press Esc to stop it first.", severity="warning")
        elif models.engine is None:
            why = (f"The model is still loading ({host.status.info.state})." if models.loading
                   else f"No model is loaded: {models.error}")
            host.notify(why + " Your message stays in the input.", severity="warning")
        else:
            return True
        return False

    async def send(self, text: str, route: str = "auto", *, queued: bool = False,
                   recall: str | None = None, images: tuple[ImageFile, ...] = ()) -> None:
        """Send ``text`` (with its pictures, ``images``) now, or queue it (type-ahead) while a
        reply streams or the model loads. With no model and none loading it stays in the input,
        with a notice saying why. ``recall``: what Up brings back (the typed text, without
        attached files)."""
        host = self._host
        recall = text if recall is None else recall
        if images:  # the remote reads no pictures: a message with some is answered here
            route = "local"
        conversation = host.conversation
        if conversation is None:
            return
        if not queued and self.must_queue():
            host.prompt.remember(recall)
            host.prompt.clear()
            await self._queue.add(text, route, images)
            return
        if not self.ready():
            return
        engine = self._models.engine
        assert engine is not None  # checked by ready()
        if not queued:
            host.prompt.remember(recall)
            host.prompt.clear()
        self._draft.cancel()
        self._answered_by(route)
        turn_id = next(self._ids)

        def wake() -> None:
            host.post_message(TurnWake(turn_id))

        mailbox = TurnMailbox(wake)
        turn = ActiveTurn(turn_id, conversation, None, mailbox, LiveMeter(),
                          context_before=host.status.info.n_ctx_used, shape=self._models.answer_format)
        self.current = turn
        host.set_state("prefilling")
        # The model starts first: mounting the prompt and its empty reply takes tens of ms of UI
        # time, which prefill overlaps (no event is shown before this handler returns).
        host.run_worker(functools.partial(self._generate, turn, text, engine.name, route, images),
                        thread=True, group="turn", exit_on_error=False)
        await asyncio.sleep(0)  # lets the worker's task hand the turn to its thread now
        turn.reply = await host.chat_log.add_prompt(text, images)
        turn.reply.body.slack_rows = self.pacer.budget.slack_rows
        turn.reply.json_block = turn.shape is not None and turn.shape.is_json

    def must_queue(self) -> bool:
        """Whether a message sent now waits in the queue: a reply streams, the model is loading,
        or earlier messages are still waiting (order is kept)."""
        models = self._models
        return self.current is not None or bool(self._queue.items) \
            or (models.engine is None and bool(models.loading))

    async def send_queued(self) -> None:
        """Send the oldest queued message if the engine is free (after a reply or a load)."""
        if not self._queue.items or self.current is not None or self._models.engine is None:
            return
        item = await self._queue.take_oldest()
        await self.send(item.text, item.route, queued=True, images=item.images)

    def _answered_by(self, route: str) -> None:
        """The reply now comes from ``route`` (a send's, or a hand-over's): the frames' budget,
        and the status bar's route field, which names the model answering now."""
        host = self._host
        self.pacer.budget = route_budget(self._models.engine, route)
        host.status.info.route = "remote" if route == "remote" else "local"
        host.status.refresh()

    def _generate(self, turn: ActiveTurn, text: str, model: str, route: str = "auto",
                  images: tuple[ImageFile, ...] = ()) -> None:
        host = self._host
        try:
            with turn.conversation.turn_lock() as arrived:
                if arrived:  # before any event of this turn: shown above its prompt
                    host.post_message(TurnsArrived(turn.id, arrived))
                turn.handle = turn.conversation.send(text, route, images)
                for notice in turn.conversation.take_notices():
                    turn.mailbox.put(notice)
                if turn.stop_requested:
                    turn.handle.stop()
                host.post_message(SessionChanged())  # the first prompt gives the session its title
                # A Done is the turn's final event only if nothing follows it: one that a tool
                # round follows (the reply called tools) is shown as that round's end.
                held: Done | None = None
                for event in turn.handle:
                    if held is not None:
                        turn.mailbox.put(ToolRoundDone(held))
                        held = None
                    if isinstance(event, Done):
                        held = event
                    else:
                        turn.mailbox.put(event)
                if held is not None:
                    turn.conversation.record_reply(held, model)
                    turn.mailbox.put(held)
        except UserError as exc:
            turn.mailbox.put(Failed(str(exc)))
        except Exception as exc:  # a store or engine bug must still end the turn on screen
            log.exception("turn failed")
            turn.mailbox.put(Failed(f"{type(exc).__name__}: {exc}"))

    async def show_arrived(self, message: TurnsArrived) -> None:
        """Turns another process stored meanwhile: shown above the prompt of the turn they preceded."""
        turn = self.current
        if turn is not None and turn.id == message.turn_id and turn.reply is not None:
            await self._host.chat_log.add_turns_before_prompt(message.turns, turn.reply)

    async def wake(self, message: TurnWake) -> None:
        """The worker put events in the mailbox: show them now, or at the next frame."""
        turn = self.current
        if turn is None or message.turn_id != turn.id:
            return
        # The first token is never held back: TTFT is what the user feels most.
        wait = self.pacer.wait() if turn.meter.first_token_at is not None else 0.0
        if wait > 0:
            self._host.set_timer(wait, lambda: self._show_events(turn))
        else:
            await self._show_events(turn)

    async def _show_events(self, turn: ActiveTurn) -> None:
        async with self._showing:
            await self._show_events_now(turn)

    async def _show_events_now(self, turn: ActiveTurn) -> None:
        if turn is not self.current:
            return
        if turn.meter.first_token_at is None:
            # Until the first token, the UI's CPU went to adding the prompt and prefill progress,
            # not to streaming: it must not stretch the frames that follow.
            self.pacer.start()
        self.pacer.frame()
        for event in turn.mailbox.take():
            await self._show_event(turn, event)
        if turn is self.current and turn.reply is not None:
            await self._host.chat_log.fold_scrolled_away(turn.reply)

    async def _show_event(self, turn: ActiveTurn,
                          event: Event | TokenRun | ThinkingRun | ToolRoundDone) -> None:
        host = self._host
        if isinstance(event, TokenRun | ThinkingRun | PrefillProgress):
            state = host.status.info.state
            await turn.show_progress(event, host.status.info)
            now = time.perf_counter()
            if host.status.info.state != state or now - self._status_shown_at >= STATUS_REFRESH_S:
                self._status_shown_at = now
                host.status.refresh()
        elif isinstance(event, RouteChanged):
            self._answered_by(event.route)
            if turn.reply is not None:
                await (turn.reply.supersede(event.message) if event.route == "remote"
                       else turn.reply.unsupersede())
                turn.reply.body.slack_rows = self.pacer.budget.slack_rows
            host.notify(event.message)
        elif isinstance(event, Notice):
            host.notify(event.message, severity="warning" if event.kind == "warning" else "information")
        elif isinstance(event, ToolCalled | ToolApproval | ToolReturned):
            await self.tools.show(turn.reply, event)
        elif isinstance(event, ToolRoundDone):
            host.status.info.show_timings(event.done.timings)
            if turn.reply is not None:
                await turn.reply.end_round()
        elif isinstance(event, Done):
            await self._finish(turn, event)
        elif isinstance(event, Failed):
            await self._fail(turn, event)

    async def _finish(self, turn: ActiveTurn, done: Done) -> None:
        host = self._host
        self.current = None
        self.tools.deny_open_questions()
        stopped = done.finish_reason == "aborted"
        host.status.info.show_timings(done.timings)
        host.set_state("stopped" if stopped else "idle")
        host.chat_log.unfold_reply()
        if turn.reply is not None:
            if stopped:
                for view in turn.reply.calls:
                    view.stopped()
            model = done.timings.model or host.status.info.model
            await turn.reply.finish(turn.reply.final_answer(done), reply_caption(model, done.timings, stopped=stopped),
                                    stopped=stopped, thinking=done.thinking, timings=done.timings)
        problem = turn.shape.verdict(done.answer, done.finish_reason) if turn.shape else None
        if problem is not None:
            host.notify(problem[0].upper() + problem[1:] + ".", severity="warning", timeout=10)
        elif done.finish_reason == "length":
            host.notify("The reply reached the max_tokens limit.", severity="warning")
        if not stopped:
            host.withdraw_notices("turn")  # an earlier failure no longer applies
        await self._after()

    async def _fail(self, turn: ActiveTurn, failed: Failed) -> None:
        host = self._host
        self.current = None
        self.tools.deny_open_questions()
        host.set_state("idle")
        host.chat_log.unfold_reply()
        if turn.reply is not None:
            for view in turn.reply.calls:
                view.stopped()
            await turn.reply.fail(failed.message)
        host.notify(failed.message, title="The reply failed", severity="error", timeout=10, cause="turn")
        await self._after()

    async def _after(self) -> None:
        host = self._host
        refresh_sidebar(host)
        if self.quit_when_idle:
            host.exit(return_code=self._quit_status)
            return
        await self.send_queued()
        if self.current is None and host.prompt.text:
            self._draft.schedule(host.prompt.text)  # typed while the reply streamed

    # --- stopping ---------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Ctrl+C: stop a streaming reply; when idle, ask before quitting."""
        host = self._host
        if self.current is not None:
            self.stop()
        elif isinstance(host.screen, ConfirmScreen):
            host.screen.dismiss(True)
        elif isinstance(host.focused, PromptInput) and host.focused.selected_text:
            host.copy_to_clipboard(host.focused.selected_text)
        else:
            host.push_screen(ConfirmScreen("Quit localchat?", yes="Quit"), self._quit_if)

    async def _quit_if(self, confirmed: bool | None) -> None:
        if confirmed:
            await self.quit()

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.tools.deny_open_questions()
            self._host.set_state("stopping")

    async def quit(self, status: int = 0) -> None:
        """Quit with exit status ``status``; a streaming reply is stopped first so that it is
        saved (as stopped)."""
        if self.current is None or self.quit_when_idle:
            # A second quit while the reply has not ended (a worker stuck in a template render,
            # say) exits anyway: tui/shutdown.py gives the worker its grace period, then ends.
            self._host.exit(return_code=status or self._quit_status)
            return
        self.quit_when_idle = True
        self._quit_status = status
        self.stop()
