"""Files attached to the next message in the app: ``/file PATH`` or an ``@path`` in the message
(Tab completes paths after ``@``). Each shows as a chip above the input with its token count;
``/file clear`` removes them. Mixed into ``LocalChatApp``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from textual.widgets import Static

from localchat.attachments import (
    Attachment,
    complete_path,
    mentioned_files,
    read_attachment,
    with_attachments,
)
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
        engine = self.engine
        limit = None
        if engine is not None:
            reply = self.sampling.max_tokens if self.sampling is not None else 1024
            used = sum(a.tokens for a in self.attachments)
            limit = engine.n_ctx - min(reply, engine.n_ctx // 2) - used
        attachment = await asyncio.to_thread(
            read_attachment, path_text, engine.count_tokens if engine is not None else None, limit)
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

    async def message_with_files(self: LocalChatApp, text: str) -> str:
        """``text`` with the attached files and those it mentions as ``@path`` (then cleared).
        Raises ``UserError`` (the message then stays in the input) for a file that cannot go."""
        for path in mentioned_files(text):
            if all(str(a.path) != path for a in self.attachments):
                await self.attach_file(path)
        message = with_attachments(text, self.attachments)
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
