"""Files attached to the next message in the app: ``/file PATH`` or an ``@path`` in the message
(Tab completes paths after ``@``). Each shows as a chip above the input with its token count;
``/file clear`` removes them. Mixed into ``LocalChatApp``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from textual.widgets import Static

from localchat.attachments import (
    Attachment,
    complete_path,
    outgoing_message,
    read_attachment,
)
from localchat.session.budget import message_room
from localchat.tui.slash import Completion

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp


class AttachmentChips(Static):
    """``📎 notes.md · 1,234 tokens`` for each attached file (hidden when there are none)."""

    def show(self, attachments: list[Attachment]) -> None:
        self.display = bool(attachments)
        self.update("  ".join(f"📎 {a.chip}" for a in attachments) + "  · /file clear removes")


class Attachments:
    async def attach_file(self: LocalChatApp, path_text: str) -> Attachment:
        """Read ``path_text`` and attach it to the next message. Raises ``UserError``. The file
        is read and tokenized off the event loop (it may be megabytes)."""
        count_tokens, room = self.file_budget()
        if room is not None:
            room -= sum(a.tokens for a in self.attachments)
        attachment = await asyncio.to_thread(read_attachment, path_text, count_tokens, room)
        self.attachments.append(attachment)
        self.query_one(AttachmentChips).show(self.attachments)
        return attachment

    async def slash_file(self: LocalChatApp, path_text: str) -> None:
        if path_text == "clear":
            self.attachments.clear()
            self.query_one(AttachmentChips).show([])
            self.notify("Attachments removed.")
            return
        attachment = await self.attach_file(path_text)
        self.notify(f"Attached {attachment.chip}; it goes with your next message.")
        self.schedule_draft_prefill(self.prompt.text)  # the model can read the file meanwhile

    def file_budget(self: LocalChatApp) -> tuple[Callable[[str], int] | None, int | None]:
        """The tokenizer and the room files may take in a message (None, None: no model yet,
        counts are estimated and no limit is known)."""
        engine = self.engine
        if engine is None:
            return None, None
        reply = self.sampling.max_tokens if self.sampling is not None else 1024
        return engine.count_tokens, message_room(engine.n_ctx, reply)

    def outgoing(self: LocalChatApp, text: str) -> Callable[[], str]:
        """``text`` as it will be sent now (``localchat.attachments.outgoing_message``): the
        attached files and those it mentions as ``@path``. The call returned reads and
        tokenizes files, to be made off the event loop; it raises ``UserError``."""
        attached, (count_tokens, room), cwd = list(self.attachments), self.file_budget(), Path.cwd()
        return lambda: outgoing_message(text, attached, cwd, count_tokens=count_tokens, room=room)

    async def message_with_files(self: LocalChatApp, text: str) -> str:
        """``text`` as it will be sent (then the attachments are cleared). Raises ``UserError``
        (the message then stays in the input) for a file that cannot go."""
        message = await asyncio.to_thread(self.outgoing(text))
        self.attachments.clear()
        self.query_one(AttachmentChips).show([])
        return message


def path_completions(text: str) -> list[Completion]:
    """After ``@`` at the end of the input: the paths it may go on to, as whole inputs."""
    head, _, word = text.rpartition(" ") if " " in text else ("", "", text)
    if not word.startswith("@") or "\n" in word:
        return []
    prefix = head + " " if head else ""
    return [Completion(f"{prefix}@{path}", path) for path in complete_path(word[1:] or "./")]
