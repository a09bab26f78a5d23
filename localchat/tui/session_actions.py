"""What the user can do to sessions and to the conversation: slash commands, sidebar requests,
and the same actions in the command palette. Mixed into ``LocalChatApp``; kept apart so the app module stays about
layout, model loading and streaming.

Every handler lets ``UserError`` escape to ``run_slash_command`` or ``@shows_user_errors``,
which turn it into a one-line notice.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from textual.app import SystemCommand
from textual.markup import escape
from textual.screen import Screen

from localchat.atomic import write_text_atomic
from localchat.chat.conversation import Conversation
from localchat.errors import UserError
from localchat.store import SessionRecord, TurnRecord
from localchat.store.export import quote
from localchat.tui import slash
from localchat.tui.clipboard import copy_fallback, in_tmux, osc52_sequence
from localchat.tui.screens import AskTextScreen, ConfirmScreen, HelpScreen, PageScreen, SearchScreen
from localchat.tui.sidebar import SessionRequest

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def shows_user_errors(handler: F) -> F:
    """Run an async handler; a ``UserError`` it raises becomes an error notice."""

    @functools.wraps(handler)
    async def wrapper(self: LocalChatApp, *args: Any) -> Any:
        try:
            return await handler(self, *args)
        except UserError as exc:
            self.notify(str(exc), severity="error")
            return None

    return wrapper  # type: ignore[return-value]


class SessionActions:
    # Set here as well as by the app.
    model_ref: str | None
    conversation: Conversation | None
    editing: int | None
    # --- sessions ---------------------------------------------------------------------------

    async def open_session(self: LocalChatApp, record: SessionRecord) -> None:
        """Show ``record`` and continue it with the loaded model. A reply still streaming in the
        session being left is stopped; its worker saves it (as stopped) to that session."""
        if self.turn is not None:
            self.turn.stop()
            self.turn.reply = None
        await self.drop_queued("You left the session they were typed in.")
        self.cancel_draft_prefill()
        previous = self.conversation
        if previous is not None:
            previous.close()
        if previous is not None and previous.session_id != record.id:
            self._discard_if_empty(previous)
        self.conversation = Conversation(self.store, record, self.services)
        if not self.store.read_only:  # a full disk or a read-only home: shown, not moved up
            self.store.touch(record.id)
        self.editing = None
        turns = self.conversation.turns()
        await self.show_conversation()
        if self.engine is not None:
            self.conversation.attach(self.engine, self.sampling)
        self.show_session_numbers(turns)
        self.prompt.border_title = record.label
        self.refresh_sidebar()

    def show_session_numbers(self: LocalChatApp, turns: list[TurnRecord]) -> None:
        """The status bar shows the open session: its last reply's numbers and the context it
        filled (0 for an empty or cleared one), never those of the session shown before."""
        info = self.status.info
        last = next((t.timings for t in reversed(turns) if t.role == "assistant" and t.timings), None)
        n_ctx = info.n_ctx  # the loaded model's, whatever model the session used before
        info.ttft_ms = info.answer_ms = info.tpot_ms = info.tokens_per_s = info.cache_n = info.prompt_n = None
        info.n_ctx_used = 0
        if last is not None:
            info.show_timings(last)
            info.n_ctx = n_ctx or info.n_ctx
        self.status.refresh()

    def _discard_if_empty(self: LocalChatApp, conversation: Conversation) -> None:
        """Sessions the user opened and left without writing anything are not kept."""
        try:
            record = conversation.record
            if record.turn_count == 0 and not record.name and not record.system:
                self.store.delete_session(record.id)
        except UserError:  # already deleted, or the database is busy: nothing worth keeping was lost
            pass

    def refresh_sidebar(self: LocalChatApp) -> None:
        """Show the store's current session list and title (after any change to either)."""
        current = self.conversation.session_id if self.conversation else None
        try:
            if self.sidebar.display:
                # Empty sessions left by a crash or another window are not worth a line.
                sessions = [r for r in self.store.list_sessions()
                            if r.turn_count or r.name or r.system or r.id == current]
                self.sidebar.show(sessions, current)
            if self.conversation is not None:
                self.prompt.border_title = self.conversation.record.label
        except UserError as exc:  # the database is locked by another process or unreadable
            self.notify(str(exc), severity="error")

    def action_toggle_sidebar(self: LocalChatApp) -> None:
        self.sidebar.display = not self.sidebar.display
        if self.sidebar.display:
            self.refresh_sidebar()
            self.sidebar.sessions.focus()
        else:
            self.prompt.focus()

    @shows_user_errors
    async def action_new_session(self: LocalChatApp) -> None:
        await self.open_session(self.store.create_session())

    @shows_user_errors
    async def on_session_request(self: LocalChatApp, request: SessionRequest) -> None:
        if request.action == "leave":
            self.prompt.focus()
            return
        if request.action == "new":
            await self.action_new_session()
            return
        if request.session_id is None:
            return
        target = self.store.session(request.session_id)
        if request.action == "open":
            await self.open_session(target)
            self.prompt.focus()
        elif request.action == "rename":
            self.push_screen(AskTextScreen(f"Rename “{target.label}” to:", target.name or target.title),
                             functools.partial(self._rename_session, target.id))
        elif request.action == "delete":
            self.push_screen(ConfirmScreen(f"Delete “{target.label}” and all its messages?", yes="Delete"),
                             functools.partial(self._delete_session, target.id))

    @shows_user_errors
    async def _rename_session(self: LocalChatApp, session_id: int, name: str | None) -> None:
        if name:
            self.store.rename_session(session_id, name)
            self.refresh_sidebar()

    @shows_user_errors
    async def _delete_session(self: LocalChatApp, session_id: int, confirmed: bool | None) -> None:
        if not confirmed:
            return
        if self.turn is not None and self.turn.conversation.session_id == session_id:
            raise UserError("That session's reply is still streaming. Press Esc first.")
        self.store.delete_session(session_id)
        if self.services is not None and self.services.snapshots is not None:
            self.services.snapshots.forget(session_id)
        if self.conversation is not None and self.conversation.session_id == session_id:
            self.conversation = None
            await self.open_session(self.store.last_session() or self.store.create_session())
        self.refresh_sidebar()

    # --- slash commands ---------------------------------------------------------------------

    @shows_user_errors
    async def run_slash_command(self: LocalChatApp, text: str) -> None:
        command, argument = slash.parse(text)
        await getattr(self, f"slash_{command.name}")(argument)

    async def slash_new(self: LocalChatApp, argument: str) -> None:
        await self.action_new_session()

    async def slash_model(self: LocalChatApp, name: str) -> None:
        if self.turn is not None:
            raise UserError("Stop the reply (Esc) before switching models.")
        if self.loading_model:
            raise UserError(f"{self.loading_model} is still loading; switch when it is ready.")
        self.model_ref = name
        self.load_model(name)

    async def slash_system(self: LocalChatApp, text: str) -> None:
        """``/system TEXT`` sets the prompt from the next turn on, ``/system`` shows it,
        ``/system clear`` removes it."""
        conversation = self._require_conversation()
        if not text:
            current = conversation.record.system
            self.push_screen(PageScreen("# System prompt\n\n" + (
                quote(current) + "\n\n_Change it with `/system TEXT`, remove it with `/system clear`._"
                if current else "_None set. Set one with `/system TEXT`._")))
            return
        cleared = text.lower() == "clear"
        conversation.set_system("" if cleared else text)
        self.notify("System prompt cleared." if cleared else "System prompt set; it applies from the next message.")

    async def slash_clear(self: LocalChatApp, argument: str) -> None:
        self.push_screen(ConfirmScreen("Forget all messages of this session?", yes="Clear"), self._clear)

    @shows_user_errors
    async def _clear(self: LocalChatApp, confirmed: bool | None) -> None:
        if not confirmed:
            return
        if self.turn is not None:
            raise UserError("Stop the reply (Esc) before clearing.")
        self._require_conversation().clear()
        await self.chat_log.show_turns([])
        self.show_session_numbers([])
        self.refresh_sidebar()

    async def slash_retry(self: LocalChatApp, argument: str) -> None:
        if not self._ready_for_a_turn():
            return
        conversation = self._require_conversation()
        seq = conversation.last_prompt().seq
        prompt = conversation.take_back_last_prompt()  # the old reply stays a branch
        await self.show_conversation()
        await self.send_prompt(prompt)
        self.mark_new_version(seq)

    async def slash_copy(self: LocalChatApp, argument: str) -> None:
        if argument not in ("", "code"):
            raise UserError("Usage: /copy [code] — the last reply, or its last code block.")
        conversation = self._require_conversation()
        text = conversation.last_code_block() if argument == "code" else conversation.last_reply()
        self.copy_text(text)

    def copy_text(self: LocalChatApp, text: str) -> None:
        """Copy ``text``: OSC 52 (tmux passthrough inside tmux), then a fallback that says where
        the text surely went."""
        if in_tmux():  # Textual's plain OSC 52 would stop at tmux
            self._clipboard = text
            if self._driver is not None:
                self._driver.write(osc52_sequence(text))  # on this thread: it writes to the terminal
        else:
            self.copy_to_clipboard(text)
        self._copy_fallback(text)

    def _copy_fallback(self: LocalChatApp, text: str) -> None:
        def copy() -> None:
            message = copy_fallback(text)
            self.call_from_thread(self.notify, message)

        self.run_worker(copy, thread=True, group="clipboard", exit_on_error=False)

    async def slash_sessions(self: LocalChatApp, argument: str) -> None:
        self.action_toggle_sidebar()

    async def slash_search(self: LocalChatApp, text: str) -> None:
        hits = self.store.search(text)
        if not hits:
            raise UserError(f"No message contains “{text}”.")
        labels = {s.id: s.label for s in self.store.list_sessions()}
        rows = [(h.session_id, labels.get(h.session_id, "?"),
                 ("you: " if h.role == "user" else "reply: ") + " ".join(h.snippet.split())) for h in hits]
        self.push_screen(SearchScreen(text, rows), self._open_found)

    @shows_user_errors
    async def _open_found(self: LocalChatApp, session_id: int | None) -> None:
        if session_id is not None and (self.conversation is None or self.conversation.session_id != session_id):
            await self.open_session(self.store.session(session_id))
        self.prompt.focus()

    async def slash_rename(self: LocalChatApp, name: str) -> None:
        record = self._require_conversation().rename(name)
        self.refresh_sidebar()
        self.notify(f"Session renamed to “{record.label}”.")

    async def slash_export(self: LocalChatApp, path_text: str) -> None:
        conversation = self._require_conversation()
        path = Path(path_text).expanduser() if path_text else Path.cwd() / export_file_name(conversation.record)
        if path.is_dir():
            path = path / export_file_name(conversation.record)
        try:
            as_json = path.suffix.lower() == ".json"
            write_text_atomic(path, conversation.to_json() if as_json else conversation.to_markdown())
        except OSError as exc:
            raise UserError(f"Could not write {path}: {exc.strerror or exc}") from None
        self.notify(f"Exported to {path}")

    async def slash_summary(self: LocalChatApp, argument: str) -> None:
        summary = self._require_conversation().summary
        self.push_screen(PageScreen(
            "# Context summary\n\n" + (summary or "_No summary yet: every turn of this session still "
                                                 "fits in the model's context._")
        ))

    async def slash_stats(self: LocalChatApp, argument: str) -> None:
        from localchat.chat.speed import session_speed_markdown

        # Off the event loop: it reads every stored reply.
        text = await asyncio.to_thread(session_speed_markdown, self.store,
                                       self._require_conversation().session_id)
        self.push_screen(PageScreen(text))

    async def slash_big(self: LocalChatApp, text: str) -> None:
        """Send this message to the remote (large) model, whatever the routing mode."""
        await self.send_prompt(text, route="remote")

    async def slash_help(self: LocalChatApp, argument: str) -> None:
        self.push_screen(HelpScreen())

    async def slash_think(self: LocalChatApp, argument: str) -> None:
        self.notify(set_thinking(self, argument.lower()))

    def action_toggle_thinking(self: LocalChatApp) -> None:
        """Ctrl+T: open or fold the reasoning blocks of every reply (remembered)."""
        show = not self.chat_log.show_thinking
        self.chat_log.set_show_thinking(show)
        self.store.set_setting("show_thinking", "yes" if show else "no")

    # --- command palette --------------------------------------------------------------------

    def get_system_commands(self: LocalChatApp, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)  # App's, next in the MRO
        for command in slash.COMMANDS:
            if command.argument_required:
                # Needs an argument: put the command in the input for the user to finish.
                callback = functools.partial(self._prefill_prompt, f"/{command.name} ")
            else:
                callback = functools.partial(self._run_slash_worker, f"/{command.name}")
            # The palette reads help as markup: "[remote]" would vanish as an unknown style.
            yield SystemCommand(f"/{command.name}", escape(command.help), callback)
        yield SystemCommand("Show or hide thinking", "Open or fold the reasoning of thinking models "
                            "(Ctrl+T)", self.action_toggle_thinking)

    def _run_slash_worker(self: LocalChatApp, text: str) -> None:
        self.run_worker(self.run_slash_command(text))

    def _prefill_prompt(self: LocalChatApp, text: str) -> None:
        self.prompt.text = text
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    def _require_conversation(self: LocalChatApp) -> Conversation:
        if self.conversation is None:
            raise UserError("No session is open.")
        return self.conversation


def set_thinking(app: LocalChatApp, mode: str) -> str:
    """``/think MODE``: set the thinking switch for the next turns; the line to show the user."""
    from localchat.engine.options import Sampling
    from localchat.settings import THINKING_MODES

    engine = app.engine
    has_switch = bool(getattr(engine, "supports_thinking", False))
    model = engine.name if engine is not None else "the model"
    if not mode:
        current = app.sampling.thinking if app.sampling is not None else "auto"
        switch = "has a thinking switch" if has_switch else "has no thinking switch"
        return f"Thinking: {current} ({model} {switch})."
    if mode not in THINKING_MODES:
        raise UserError("Usage: /think on|off|auto")
    if app.sampling is None:
        app.sampling = Sampling()
    app.sampling.thinking = app.thinking_mode = mode
    chat = app.conversation.chat if app.conversation is not None else None
    if chat is not None:
        chat.sampling.thinking = mode
    if mode != "auto" and not has_switch:
        return f"{model} has no thinking switch: /think {mode} applies to models that have one."
    return f"Thinking {mode} from the next message."


def export_file_name(record: SessionRecord) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", record.label).strip("-").lower()[:40] or "session"
    return f"localchat-{slug}-{time.strftime('%Y%m%d-%H%M%S')}.md"


