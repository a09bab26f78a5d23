"""Files attached to the next message: ``/file PATH`` or an ``@path`` in the message. Each shows
as a chip above the input with its token count; ``/file clear`` removes them.

Pictures too: ``/image PATH``, a pasted or dropped picture path, or ``@photo.png`` in the message
(read at Enter). Each is read and checked (``store.images.read_image``: one line for a file that
is not a picture, a truncated one, one too large) and the model asked whether it reads images
(``chat.images.check_model``, off the event loop: the registry and the projector's header); its
chip gives its name, its size in pixels and, when the projector's header tells it, its tokens.
Backspace in an empty input removes the last picture; ``/image clear`` removes them all.

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

from localchat.attachments import (
    Attachment,
    FileReads,
    mentioned_files,
    outgoing_message,
    read_attachment,
)
from localchat.chat.images import check_model as model_reads_images
from localchat.context.budget import message_room
from localchat.store.images import ImageFile, read_image
from localchat.tui.image_paths import chip

if TYPE_CHECKING:
    from localchat.tui.host import Host
    from localchat.tui.model_state import ModelState


class AttachmentChips(Static):
    """``📎 notes.md · 1,234 tokens`` for each attached file, ``🖼 cat.png 640×480 · 576
    tokens`` for each picture (hidden when there are none)."""

    def show(self, attachments: list[Attachment], images: list[str] | None = None) -> None:
        images = images or []
        self.display = bool(attachments or images)
        parts = [f"📎 {a.chip}" for a in attachments] + [f"🖼 {c}" for c in images]
        how = ([" · /file clear removes files"] if attachments else []) \
            + ([" · Backspace or /image clear removes pictures"] if images else [])
        self.update("  ".join(parts) + "".join(how))


class AttachedFiles:
    """The files going with the next message, read and counted with the loaded model's
    tokenizer (``models``)."""

    def __init__(self, host: Host, models: ModelState) -> None:
        self._host = host
        self._models = models
        self.attachments: list[Attachment] = []  # files going with the next message
        self.images: list[ImageFile] = []  # pictures going with the next message
        self._image_tokens: int | None = None  # what one picture costs, if the projector says
        self._draft_reads = FileReads()  # the @path files of the draft being prefilled

    async def attach_file(self, path_text: str) -> Attachment:
        """Read ``path_text`` and attach it to the next message. Raises ``UserError``. The file
        is read and tokenized off the event loop (it may be megabytes)."""
        count_tokens, room = self.file_budget()
        if room is not None:
            room -= sum(a.tokens for a in self.attachments)
        attachment = await asyncio.to_thread(read_attachment, path_text, count_tokens, room)
        self.attachments.append(attachment)
        self._show()
        return attachment

    async def attach_images(self, paths: list[Path]) -> list[ImageFile]:
        """Read, check and attach the pictures at ``paths`` (all or none). Raises ``UserError``
        in one line: a file that is not a picture, or a model that reads none."""
        images = await asyncio.to_thread(self._read_images, paths)
        self.images.extend(images)
        self._show()
        return images

    def _read_images(self, paths: list[Path]) -> list[ImageFile]:
        images = [read_image(path) for path in paths]
        self._image_tokens = model_reads_images(self._models.loaded_ref)
        return images

    def remove_last_image(self) -> ImageFile | None:
        image = self.images.pop() if self.images else None
        self._show()
        return image

    def clear_images(self) -> None:
        self.images.clear()
        self._show()

    def clear(self) -> None:
        """No file goes with the next message any more."""
        self.attachments.clear()
        self._show()

    def _show(self) -> None:
        self._host.query_one(AttachmentChips).show(
            self.attachments, [chip(i, self._image_tokens) for i in self.images])

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
                                        read=read, images_apart=True)

    async def message_with_files(self, text: str) -> tuple[str, tuple[ImageFile, ...]]:
        """``text`` as it will be sent, and its pictures (those attached, then its
        ``@photo.png``s); then the attachments are cleared. Raises ``UserError`` (the message then
        stays in the input) for a file or a picture that cannot go."""
        outgoing, cwd = self.outgoing(text), Path.cwd()
        mentioned = [cwd / p for p in mentioned_files(text, cwd, images=True)]
        message = await asyncio.to_thread(outgoing)
        images = list(self.images)
        if mentioned:  # read and checked now, the model asked too
            images += await asyncio.to_thread(self._read_images, mentioned)
        elif images:  # the model may have changed since they were attached
            await asyncio.to_thread(model_reads_images, self._models.loaded_ref)
        self.clear()
        self.clear_images()
        return message, tuple(images)


def attached_notice(images: list[ImageFile]) -> str:
    names = ", ".join(image.ref.label for image in images)
    return (f"Attached {names}; {'it goes' if len(images) == 1 else 'they go'} with your next "
            "message (Backspace in the empty input removes the last).")
