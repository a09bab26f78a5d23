"""The composer: what the input holds on its way to becoming a message.

Files attached to the next message: ``/file PATH`` or an ``@path`` in the message (Tab completes
paths after ``@``). Each shows as a chip above the input with its token count; ``/file clear``
removes them. Completions: command names after ``/``, model names after ``/model ``, paths after
``@``, shown as hints under the input while typing. Enter (``submit``) runs a command or sends
the message with its files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from textual.widgets import Static

from localchat.attachments import (
    Attachment,
    FileReads,
    complete_path,
    outgoing_message,
    read_attachment,
)
from localchat.context.budget import message_room
from localchat.errors import UserError
from localchat.tui import commands
from localchat.tui.prompt import CommandHints, Completion

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp


class AttachmentChips(Static):
    """``📎 notes.md · 1,234 tokens`` for each attached file (hidden when there are none)."""

    def show(self, attachments: list[Attachment]) -> None:
        self.display = bool(attachments)
        self.update("  ".join(f"📎 {a.chip}" for a in attachments) + "  · /file clear removes")


class Composer:
    """What the input is composing: the files going with the next message, the completions
    offered while typing (model names are re-read each time the input starts with ``/model``),
    and what Enter does with it."""

    def __init__(self, app: LocalChatApp, list_models: Callable[[], list[tuple[str, bool]]]) -> None:
        self._app = app
        self._list_models = list_models
        self.attachments: list[Attachment] = []  # files going with the next message
        self._draft_reads = FileReads()  # the @path files of the draft being prefilled
        self.model_choices: list[tuple[str, bool]] = []
        self._typing_model = False  # the input starts with /model (model names are re-read)

    async def submit(self, text: str) -> None:
        """Enter: run a command, or send the message (with its files; resent from the prompt
        being edited, if one is)."""
        app = self._app
        if commands.is_command(text):
            if " " in text.strip():  # "/model qwen" is worth recalling; a bare "/retry" is not
                app.prompt.remember(text)
            app.prompt.clear()
            await app.commands.run(text)
            return
        typed = commands.message_text(text)
        try:
            text = await self.message_with_files(typed)
        except UserError as exc:  # the message stays in the input
            app.notify(str(exc), severity="error")
            return
        if app.message_actions.editing is not None:
            await app.message_actions.send_edited(text)
        else:
            await app.turns.send(text, recall=typed)

    # --- completions ------------------------------------------------------------------------

    def completions(self, text: str) -> list[Completion]:
        return commands.completions(text, commands.Choices(self.model_choices)) or path_completions(text)

    def changed(self, text: str) -> None:
        """The input now reads ``text``: new hints, and the draft handed over in a while."""
        self._app.query_one(CommandHints).show(self.completions(text))
        typing_model = text.startswith("/model")
        if typing_model and not self._typing_model:
            self.fetch_model_names()  # `localchat import` or `pull` may have run since
        self._typing_model = typing_model
        self._app.draft.schedule(text)

    def fetch_model_names(self) -> None:
        self._app.run_worker(self._fetch_model_names, thread=True, group="registry", exit_on_error=False)

    def _fetch_model_names(self) -> None:
        choices = self._list_models()
        self._app.call_from_thread(self._show_model_choices, choices)

    def _show_model_choices(self, choices: list[tuple[str, bool]]) -> None:
        self.model_choices = choices
        if self._typing_model:
            self._app.query_one(CommandHints).show(self.completions(self._app.prompt.text))

    # --- attachments ------------------------------------------------------------------------

    async def attach_file(self, path_text: str) -> Attachment:
        """Read ``path_text`` and attach it to the next message. Raises ``UserError``. The file
        is read and tokenized off the event loop (it may be megabytes)."""
        count_tokens, room = self.file_budget()
        if room is not None:
            room -= sum(a.tokens for a in self.attachments)
        attachment = await asyncio.to_thread(read_attachment, path_text, count_tokens, room)
        self.attachments.append(attachment)
        self._app.query_one(AttachmentChips).show(self.attachments)
        return attachment

    async def file_command(self, path_text: str) -> None:
        """``/file PATH`` attaches a file, ``/file clear`` removes them all."""
        if path_text == "clear":
            self.attachments.clear()
            self._app.query_one(AttachmentChips).show([])
            self._app.notify("Attachments removed.")
            return
        attachment = await self.attach_file(path_text)
        note = f" Note: {attachment.note}." if attachment.note else ""
        self._app.notify(f"Attached {attachment.chip}; it goes with your next message.{note}",
                         severity="warning" if note else "information")
        self._app.draft.schedule(self._app.prompt.text)  # the model can read the file meanwhile

    def file_budget(self) -> tuple[Callable[[str], int] | None, int | None]:
        """The tokenizer and the room files may take in a message (None, None: no model yet,
        counts are estimated and no limit is known)."""
        engine, sampling = self._app.models.engine, self._app.models.sampling
        if engine is None:
            return None, None
        reply = sampling.max_tokens if sampling is not None else 1024
        return engine.count_tokens, message_room(engine.n_ctx, reply)

    def outgoing(self, text: str, *, draft: bool = False) -> Callable[[], str]:
        """``text`` as it will be sent now (``localchat.attachments.outgoing_message``): the
        attached files and those it mentions as ``@path``. The call returned reads and
        tokenizes files, to be made off the event loop; it raises ``UserError``. For a ``draft``
        (prefill while typing) a file unchanged since the last draft is not read again; Enter's
        message reads every file."""
        attached, (count_tokens, room), cwd = list(self.attachments), self.file_budget(), Path.cwd()
        read = self._draft_reads.read if draft else read_attachment
        return lambda: outgoing_message(text, attached, cwd, count_tokens=count_tokens, room=room,
                                        read=read)

    async def message_with_files(self, text: str) -> str:
        """``text`` as it will be sent (then the attachments are cleared). Raises ``UserError``
        (the message then stays in the input) for a file that cannot go."""
        message = await asyncio.to_thread(self.outgoing(text))
        self.attachments.clear()
        self._app.query_one(AttachmentChips).show([])
        return message


def path_completions(text: str) -> list[Completion]:
    """After ``@`` at the end of the input: the paths it may go on to, as whole inputs."""
    head, _, word = text.rpartition(" ") if " " in text else ("", "", text)
    if not word.startswith("@") or "\n" in word:
        return []
    prefix = head + " " if head else ""
    return [Completion(f"{prefix}@{path}", path) for path in complete_path(word[1:] or "./")]
