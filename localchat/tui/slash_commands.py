"""The slash commands: each ``Command`` record is one command entire (its name, help and
argument as the user sees them, its handler, and where Tab's suggestions for its argument come
from), so a command added to ``COMMANDS`` shows up in the hints, the help screen and the command
palette, and ``/NAME ARG`` runs ``handler(ARG)``.

Every handler lets ``UserError`` escape to ``run`` (or ``@shows_user_errors``), which turns it
into a one-line notice.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import SystemCommand
from textual.markup import escape

from localchat.atomic import write_text_atomic
from localchat.errors import UserError
from localchat.store import SessionRecord
from localchat.store.export import quote
from localchat.tui.attached_files import attached_notice
from localchat.tui.host import shows_user_errors
from localchat.tui.image_paths import image_path_completions
from localchat.tui.prompt import Completion, is_command
from localchat.tui.screens import ConfirmScreen, HelpScreen, PageScreen, SearchScreen
from localchat.tui.session_view import refresh_sidebar, require, show_conversation, show_numbers

if TYPE_CHECKING:
    from localchat.tui.attached_files import AttachedFiles
    from localchat.tui.draft import DraftHandOver
    from localchat.tui.host import Host
    from localchat.tui.message_actions import MessageActions
    from localchat.tui.model_state import ModelState
    from localchat.tui.sessions import Sessions
    from localchat.tui.tool_servers import ToolServers
    from localchat.tui.turn import Turns


@dataclass(frozen=True)
class Choices:
    """What argument completions draw on (the composer keeps it fresh)."""

    models: Sequence[tuple[str, bool]] = ()  # (name, downloaded)


@dataclass(frozen=True)
class Command:
    """One slash command. ``handler(registry, argument)`` runs it with the stripped argument;
    ``complete(typed, choices)`` suggests what its argument may be (None: nothing to suggest)."""

    name: str
    help: str
    handler: Callable[[Commands, str], Awaitable[None]]
    argument: str = ""  # placeholder shown in usage, e.g. "NAME"; "" = takes none
    argument_required: bool = False
    complete: Callable[[str, Choices], list[Completion]] | None = None

    @property
    def usage(self) -> str:
        if not self.argument:
            return f"/{self.name}"
        return f"/{self.name} {self.argument}" if self.argument_required else f"/{self.name} [{self.argument}]"


class Commands:
    """The host's side of ``COMMANDS``: their handlers, and the command palette."""

    def __init__(self, host: Host, *, sessions: Sessions, models: ModelState, turns: Turns,
                 message_actions: MessageActions, tool_servers: ToolServers, files: AttachedFiles,
                 draft: DraftHandOver) -> None:
        self._host = host
        self._sessions = sessions
        self._models = models
        self._turns = turns
        self._message_actions = message_actions
        self._tool_servers = tool_servers
        self._files = files
        self._draft = draft

    @shows_user_errors
    async def run(self, text: str) -> None:
        command, argument = parse(text)
        await command.handler(self, argument)

    def show_help(self) -> None:
        """F1, ``?`` or ``/help``: the keys and the commands (not over itself)."""
        if not isinstance(self._host.screen, HelpScreen):
            self._host.push_screen(HelpScreen([(c.usage, c.help) for c in COMMANDS]))

    async def _new(self, argument: str) -> None:
        await self._sessions.new()

    async def _model(self, name: str) -> None:
        if self._turns.current is not None:
            raise UserError("Stop the reply (Esc) before switching models.")
        self._models.switch(name)

    async def _system(self, text: str) -> None:
        """``/system TEXT`` sets the prompt from the next turn on, ``/system`` shows it,
        ``/system clear`` removes it."""
        conversation = require(self._host)
        if not text:
            current = conversation.record.system
            self._host.push_screen(PageScreen("# System prompt\n\n" + (
                quote(current) + "\n\n_Change it with `/system TEXT`, remove it with `/system clear`._"
                if current else "_None set. Set one with `/system TEXT`._")))
            return
        cleared = text.lower() == "clear"
        conversation.set_system("" if cleared else text)
        self._host.notify("System prompt cleared." if cleared
                          else "System prompt set; it applies from the next message.")

    async def _clear(self, argument: str) -> None:
        self._host.push_screen(ConfirmScreen("Forget all messages of this session?", yes="Clear"),
                               self._clear_confirmed)

    @shows_user_errors
    async def _clear_confirmed(self, confirmed: bool | None) -> None:
        if not confirmed:
            return
        if self._turns.current is not None:
            raise UserError("Stop the reply (Esc) before clearing.")
        require(self._host).clear()
        await self._host.chat_log.show_turns([])
        show_numbers(self._host, [])
        refresh_sidebar(self._host)

    async def _retry(self, argument: str) -> None:
        host = self._host
        if not self._turns.ready():
            return
        conversation = require(host)
        last = conversation.last_prompt()
        seq, images = last.seq, conversation.stored_images(last)
        prompt = conversation.take_back_last_prompt()  # the old reply stays a branch
        await show_conversation(host)
        await self._turns.send(prompt, images=images)
        self._message_actions.mark_new_version(seq)

    async def _copy(self, argument: str) -> None:
        if argument not in ("", "code"):
            raise UserError("Usage: /copy [code] — the last reply, or its last code block.")
        conversation = require(self._host)
        text = conversation.last_code_block() if argument == "code" else conversation.last_reply()
        self._host.copy_text(text)

    async def _sidebar(self, argument: str) -> None:
        self._sessions.toggle_sidebar()

    async def _search(self, text: str) -> None:
        store = self._host.store
        hits = store.search(text)
        if not hits:
            raise UserError(f"No message contains “{text}”.")
        labels = {s.id: s.label for s in store.list_sessions()}
        rows = [(h.session_id, labels.get(h.session_id, "?"),
                 ("you: " if h.role == "user" else "reply: ") + " ".join(h.snippet.split())) for h in hits]
        self._host.push_screen(SearchScreen(text, rows), self._open_found)

    @shows_user_errors
    async def _open_found(self, session_id: int | None) -> None:
        conversation = self._host.conversation
        if session_id is not None and (conversation is None or conversation.session_id != session_id):
            await self._sessions.open(self._host.store.session(session_id))
        self._host.prompt.focus()

    async def _rename(self, name: str) -> None:
        record = require(self._host).rename(name)
        refresh_sidebar(self._host)
        self._host.notify(f"Session renamed to “{record.label}”.")

    async def _export(self, path_text: str) -> None:
        conversation = require(self._host)
        path = Path(path_text).expanduser() if path_text else Path.cwd() / export_file_name(conversation.record)
        if path.is_dir():
            path = path / export_file_name(conversation.record)
        try:
            as_json = path.suffix.lower() == ".json"
            write_text_atomic(path, conversation.to_json() if as_json else conversation.to_markdown())
        except OSError as exc:
            raise UserError(f"Could not write {path}: {exc.strerror or exc}") from None
        self._host.notify(f"Exported to {path}")

    async def _summary(self, argument: str) -> None:
        summary = require(self._host).summary
        self._host.push_screen(PageScreen(
            "# Context summary\n\n" + (summary or "_No summary yet: every turn of this session still "
                                                 "fits in the model's context._")
        ))

    async def _stats(self, argument: str) -> None:
        from localchat.chat.speed import session_speed_markdown

        # Off the event loop: it reads every stored reply.
        text = await asyncio.to_thread(session_speed_markdown, self._host.store,
                                       require(self._host).session_id)
        self._host.push_screen(PageScreen(text))

    async def _help(self, argument: str) -> None:
        self.show_help()

    async def _format(self, argument: str) -> None:
        self._host.notify(self._models.set_format(argument))

    async def _think(self, argument: str) -> None:
        self._host.notify(self._models.set_thinking(argument.lower()))

    async def _tools(self, argument: str) -> None:
        """``/tools`` shows the servers and their tools; ``/tools CHOICE`` sets what this
        session's messages ask of the model (auto, none, required or a tool's name)."""
        conversation = require(self._host)
        if not argument:
            self._host.push_screen(PageScreen(self._tool_servers.page(conversation.tool_choice)))
            return
        self._host.notify(self._tool_servers.set_choice(conversation, argument))

    async def _file(self, path_text: str) -> None:
        """``/file PATH`` attaches a file, ``/file clear`` removes them all."""
        if path_text == "clear":
            self._files.clear()
            self._host.notify("Attachments removed.")
            return
        attachment = await self._files.attach_file(path_text)
        note = f" Note: {attachment.note}." if attachment.note else ""
        self._host.notify(f"Attached {attachment.chip}; it goes with your next message.{note}",
                          severity="warning" if note else "information")
        self._draft.schedule(self._host.prompt.text)  # the model can read the file meanwhile

    async def _image(self, path_text: str) -> None:
        """``/image PATH`` attaches a picture, ``/image clear`` removes them all."""
        if path_text == "clear":
            self._files.clear_images()
            self._host.notify("Pictures removed.")
            return
        images = await self._files.attach_images([Path(path_text).expanduser()])
        self._host.notify(attached_notice(images))

    async def _big(self, text: str) -> None:
        await self._turns.send(text, route="remote")

    # --- command palette --------------------------------------------------------------------

    def palette(self) -> Iterable[SystemCommand]:
        """The commands in the command palette (after Textual's own)."""
        for command in COMMANDS:
            if command.argument_required:
                # Needs an argument: put the command in the input for the user to finish.
                callback = functools.partial(self._prefill_prompt, f"/{command.name} ")
            else:
                callback = functools.partial(self._run_in_worker, f"/{command.name}")
            # The palette reads help as markup: "[remote]" would vanish as an unknown style.
            yield SystemCommand(f"/{command.name}", escape(command.help), callback)
        yield SystemCommand("Show or hide thinking", "Open or fold the reasoning of thinking models "
                            "(Ctrl+T)", self._message_actions.toggle_thinking)

    def _run_in_worker(self, text: str) -> None:
        self._host.run_worker(self.run(text))

    def _prefill_prompt(self, text: str) -> None:
        prompt = self._host.prompt
        prompt.text = text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()


def format_words(typed: str, choices: Choices) -> list[Completion]:
    """``/format``'s argument: its keywords (a schema or a file is typed out)."""
    words = (("json", "any JSON object"), ("off", "answers as the model writes them"))
    return [Completion(f"/format {word}", word, about) for word, about in words
            if word.startswith(typed.strip().lower())]


def tool_choices(typed: str, choices: Choices) -> list[Completion]:
    """``/tools``'s argument: the tool choices."""
    words = (("auto", "the model may call tools (the default)"), ("none", "offer no tools"),
             ("required", "the model must call a tool"))
    return [Completion(f"/tools {word}", word, about) for word, about in words
            if word.startswith(typed.strip().lower())]


def model_names(typed: str, choices: Choices) -> list[Completion]:
    """``/model``'s argument: the known models starting with ``typed`` (one not downloaded says
    how to get it)."""
    return [Completion(f"/model {name}", name, "" if downloaded else f"not downloaded: `localchat pull {name}`")
            for name, downloaded in choices.models if name.startswith(typed.strip())]


COMMANDS: tuple[Command, ...] = (
    Command("new", "Start a new session", Commands._new),
    Command("model", "Switch model (loads in the background)", Commands._model, "NAME",
            argument_required=True, complete=model_names),
    Command("system", "Set this session's system prompt from the next message on; no text shows "
            "it, `clear` removes it", Commands._system, "TEXT|clear"),
    Command("clear", "Forget this session's messages (name and system prompt stay)", Commands._clear),
    Command("retry", "Ask the last question again", Commands._retry),
    Command("copy", "Copy the last reply, or its last code block with /copy code", Commands._copy,
            "code"),
    Command("sessions", "Show or hide the sessions sidebar", Commands._sidebar),
    Command("file", "Attach a text file to the next message (also @path in a message; `clear` "
            "removes them)", Commands._file, "PATH|clear", argument_required=True),
    Command("image", "Attach a picture (JPEG, PNG, BMP, GIF) to the next message, for a model "
            "that reads images (also @photo.png in a message, or paste/drop its path; Backspace "
            "in the empty input removes the last, `clear` removes them all)", Commands._image,
            "PATH|clear", argument_required=True, complete=lambda typed, _: image_path_completions(typed)),
    Command("search", "Find messages in every session; Enter opens the session", Commands._search,
            "TEXT", argument_required=True),
    Command("rename", "Rename this session", Commands._rename, "NAME", argument_required=True),
    Command("export", "Save this session as Markdown, or JSON for a .json PATH (default: a new .md "
            "file in the current folder)", Commands._export, "PATH"),
    Command("stats", "TTFT and TPOT of this session's replies as sparklines; p50/p95 per model",
            Commands._stats),
    Command("summary", "Show the summary of turns trimmed from the context", Commands._summary),
    Command("format", "Answers in a shape from the next message: any JSON object, a JSON Schema "
            "(its text, a .json file, or 'name, age int'), a .gbnf grammar; off; no argument shows "
            "it", Commands._format, "json|SCHEMA|FILE.gbnf|off", complete=format_words),
    Command("think", "Thinking switch for models that have one: on, off or auto (the model's "
            "default); no argument shows it", Commands._think, "on|off|auto"),
    Command("tools", "The tool servers and their tools; or what this session's messages ask of "
            "the model: auto (it may call), none, required (it must call), or a tool's name",
            Commands._tools, "auto|none|required|NAME", complete=tool_choices),
    Command("big", "Send this message to the remote large model ([remote] in config.toml)",
            Commands._big, "TEXT", argument_required=True),
    Command("help", "Show keys and commands", Commands._help),
)

_BY_NAME = {command.name: command for command in COMMANDS}


def parse(text: str) -> tuple[Command, str]:
    """Split ``/name argument`` into its command and stripped argument.

    Raises ``UserError`` for an unknown command or a missing required argument.
    """
    name, _, argument = text[1:].strip().partition(" ")
    command = _BY_NAME.get(name.lower())
    if command is None:
        close = [c.usage for c in COMMANDS if c.name.startswith(name.lower()[:2])] if name else []
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"Unknown command /{name}.{hint} Type /help for the list.")
    argument = argument.strip()
    if command.argument_required and not argument:
        raise UserError(f"Usage: {command.usage} — {command.help}.")
    return command, argument


def completions(text: str, choices: Choices = Choices()) -> list[Completion]:
    """Suggestions for the input ``text``: command names after ``/``, then what the command
    completes its argument with (model names after ``/model ``)."""
    if not is_command(text) or "\n" in text:
        return []
    head, space, rest = text[1:].partition(" ")
    if not space:
        return [Completion(f"/{c.name}" + (" " if c.argument else ""), c.usage, c.help)
                for c in COMMANDS if c.name.startswith(head.lower())]
    command = _BY_NAME.get(head.lower())
    return command.complete(rest, choices) if command is not None and command.complete else []


def export_file_name(record: SessionRecord) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", record.label).strip("-").lower()[:40] or "session"
    return f"localchat-{slug}-{time.strftime('%Y%m%d-%H%M%S')}.md"
