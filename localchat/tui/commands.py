"""The slash commands as the app runs them: each ``Command`` is a record of ``slash.COMMANDS``
(name, help, usage) with its handler, so ``/NAME ARG`` calls ``handler(ARG)``, and the command
palette offers the same list.

Every handler lets ``UserError`` escape to ``run`` (or ``@shows_user_errors``), which turns it
into a one-line notice.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import SystemCommand
from textual.markup import escape

from localchat.atomic import write_text_atomic
from localchat.errors import UserError
from localchat.store import SessionRecord
from localchat.store.export import quote
from localchat.tui import slash
from localchat.tui.clipboard import copy_text
from localchat.tui.screens import ConfirmScreen, HelpScreen, PageScreen, SearchScreen
from localchat.tui.sessions import shows_user_errors

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp


@dataclass(frozen=True)
class Command:
    """One slash command: what the user sees of it (``slash``) and what it does (``handler``,
    called with the stripped argument)."""

    slash: slash.SlashCommand
    handler: Callable[[str], Awaitable[None]]

    @property
    def name(self) -> str:
        return self.slash.name


class Commands:
    """The registry: every command of ``slash.COMMANDS`` with its handler."""

    def __init__(self, app: LocalChatApp) -> None:
        self._app = app
        handlers: dict[str, Callable[[str], Awaitable[None]]] = {
            "new": self._new, "model": self._model, "system": self._system, "clear": self._clear,
            "retry": self._retry, "copy": self._copy, "sessions": self._sessions,
            "file": app.composer.file_command, "search": self._search, "rename": self._rename,
            "export": self._export, "stats": self._stats, "summary": self._summary,
            "think": self._think, "big": functools.partial(app.turns.send, route="remote"),
            "help": self._help,
        }
        self.by_name = {c.name: Command(c, handlers[c.name]) for c in slash.COMMANDS}

    @shows_user_errors
    async def run(self, text: str) -> None:
        command, argument = slash.parse(text)
        await self.by_name[command.name].handler(argument)

    async def _new(self, argument: str) -> None:
        await self._app.sessions.new()

    async def _model(self, name: str) -> None:
        self._app.models.switch(name)

    async def _system(self, text: str) -> None:
        """``/system TEXT`` sets the prompt from the next turn on, ``/system`` shows it,
        ``/system clear`` removes it."""
        conversation = self._app.sessions.require()
        if not text:
            current = conversation.record.system
            self._app.push_screen(PageScreen("# System prompt\n\n" + (
                quote(current) + "\n\n_Change it with `/system TEXT`, remove it with `/system clear`._"
                if current else "_None set. Set one with `/system TEXT`._")))
            return
        cleared = text.lower() == "clear"
        conversation.set_system("" if cleared else text)
        self._app.notify("System prompt cleared." if cleared
                         else "System prompt set; it applies from the next message.")

    async def _clear(self, argument: str) -> None:
        self._app.push_screen(ConfirmScreen("Forget all messages of this session?", yes="Clear"),
                              self._clear_confirmed)

    @shows_user_errors
    async def _clear_confirmed(self, confirmed: bool | None) -> None:
        if not confirmed:
            return
        if self._app.turns.current is not None:
            raise UserError("Stop the reply (Esc) before clearing.")
        self._app.sessions.require().clear()
        await self._app.chat_log.show_turns([])
        self._app.sessions.show_numbers([])
        self._app.sessions.refresh_sidebar()

    async def _retry(self, argument: str) -> None:
        app = self._app
        if not app.turns.ready():
            return
        conversation = app.sessions.require()
        seq = conversation.last_prompt().seq
        prompt = conversation.take_back_last_prompt()  # the old reply stays a branch
        await app.sessions.show_conversation()
        await app.turns.send(prompt)
        app.message_actions.mark_new_version(seq)

    async def _copy(self, argument: str) -> None:
        if argument not in ("", "code"):
            raise UserError("Usage: /copy [code] — the last reply, or its last code block.")
        conversation = self._app.sessions.require()
        text = conversation.last_code_block() if argument == "code" else conversation.last_reply()
        copy_text(self._app, text)

    async def _sessions(self, argument: str) -> None:
        self._app.sessions.toggle_sidebar()

    async def _search(self, text: str) -> None:
        store = self._app.store
        hits = store.search(text)
        if not hits:
            raise UserError(f"No message contains “{text}”.")
        labels = {s.id: s.label for s in store.list_sessions()}
        rows = [(h.session_id, labels.get(h.session_id, "?"),
                 ("you: " if h.role == "user" else "reply: ") + " ".join(h.snippet.split())) for h in hits]
        self._app.push_screen(SearchScreen(text, rows), self._open_found)

    @shows_user_errors
    async def _open_found(self, session_id: int | None) -> None:
        conversation = self._app.conversation
        if session_id is not None and (conversation is None or conversation.session_id != session_id):
            await self._app.sessions.open(self._app.store.session(session_id))
        self._app.prompt.focus()

    async def _rename(self, name: str) -> None:
        record = self._app.sessions.require().rename(name)
        self._app.sessions.refresh_sidebar()
        self._app.notify(f"Session renamed to “{record.label}”.")

    async def _export(self, path_text: str) -> None:
        conversation = self._app.sessions.require()
        path = Path(path_text).expanduser() if path_text else Path.cwd() / export_file_name(conversation.record)
        if path.is_dir():
            path = path / export_file_name(conversation.record)
        try:
            as_json = path.suffix.lower() == ".json"
            write_text_atomic(path, conversation.to_json() if as_json else conversation.to_markdown())
        except OSError as exc:
            raise UserError(f"Could not write {path}: {exc.strerror or exc}") from None
        self._app.notify(f"Exported to {path}")

    async def _summary(self, argument: str) -> None:
        summary = self._app.sessions.require().summary
        self._app.push_screen(PageScreen(
            "# Context summary\n\n" + (summary or "_No summary yet: every turn of this session still "
                                                 "fits in the model's context._")
        ))

    async def _stats(self, argument: str) -> None:
        from localchat.chat.speed import session_speed_markdown

        # Off the event loop: it reads every stored reply.
        text = await asyncio.to_thread(session_speed_markdown, self._app.store,
                                       self._app.sessions.require().session_id)
        self._app.push_screen(PageScreen(text))

    async def _help(self, argument: str) -> None:
        self._app.push_screen(HelpScreen())

    async def _think(self, argument: str) -> None:
        self._app.notify(self._app.models.set_thinking(argument.lower()))

    # --- command palette --------------------------------------------------------------------

    def palette(self) -> Iterable[SystemCommand]:
        """The commands in the command palette (after Textual's own)."""
        for command in slash.COMMANDS:
            if command.argument_required:
                # Needs an argument: put the command in the input for the user to finish.
                callback = functools.partial(self._prefill_prompt, f"/{command.name} ")
            else:
                callback = functools.partial(self._run_in_worker, f"/{command.name}")
            # The palette reads help as markup: "[remote]" would vanish as an unknown style.
            yield SystemCommand(f"/{command.name}", escape(command.help), callback)
        yield SystemCommand("Show or hide thinking", "Open or fold the reasoning of thinking models "
                            "(Ctrl+T)", self._app.action_toggle_thinking)

    def _run_in_worker(self, text: str) -> None:
        self._app.run_worker(self.run(text))

    def _prefill_prompt(self, text: str) -> None:
        prompt = self._app.prompt
        prompt.text = text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()


def export_file_name(record: SessionRecord) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", record.label).strip("-").lower()[:40] or "session"
    return f"localchat-{slug}-{time.strftime('%Y%m%d-%H%M%S')}.md"
