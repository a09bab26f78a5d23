"""Files attached to the next message: ``/file PATH`` or an ``@path`` in the message. Each shows
as a chip above the input with its token count; ``/file clear`` removes them.

``outgoing`` gives a message as it will be sent, with the attached files and those it mentions
as ``@path`` (``localchat.attachments.outgoing_message``): Enter sends that, and the draft being
prefilled while typing (``draft``) is that too, so Enter reuses the prefill.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from textual.widgets import Static

from localchat.attachments import Attachment, FileReads, outgoing_message, read_attachment
from localchat.context.budget import message_room

if TYPE_CHECKING:
    from localchat.tui.host import Host
    from localchat.tui.model_state import ModelState


class AttachmentChips(Static):
    """``📎 notes.md · 1,234 tokens`` for each attached file (hidden when there are none)."""

    def show(self, attachments: list[Attachment]) -> None:
        self.display = bool(attachments)
        self.update("  ".join(f"📎 {a.chip}" for a in attachments) + "  · /file clear removes")


class AttachedFiles:
    """The files going with the next message, read and counted with the loaded model's
    tokenizer (``models``)."""

    def __init__(self, host: Host, models: ModelState) -> None:
        self._host = host
        self._models = models
        self.attachments: list[Attachment] = []  # files going with the next message
        self._draft_reads = FileReads()  # the @path files of the draft being prefilled

    async def attach_file(self, path_text: str) -> Attachment:
        """Read ``path_text`` and attach it to the next message. Raises ``UserError``. The file
        is read and tokenized off the event loop (it may be megabytes)."""
        count_tokens, room = self.file_budget()
        if room is not None:
            room -= sum(a.tokens for a in self.attachments)
        attachment = await asyncio.to_thread(read_attachment, path_text, count_tokens, room)
        self.attachments.append(attachment)
        self._host.query_one(AttachmentChips).show(self.attachments)
        return attachment

    def clear(self) -> None:
        """No file goes with the next message any more."""
        self.attachments.clear()
        self._host.query_one(AttachmentChips).show([])

    def file_budget(self) -> tuple[Callable[[str], int] | None, int | None]:
        """The tokenizer and the room files may take in a message (None, None: no model yet,
        counts are estimated and no limit is known)."""
        engine, sampling = self._models.engine, self._models.sampling
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
        self.clear()
        return message
