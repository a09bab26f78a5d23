"""Pictures on the wire to an OpenAI-compatible remote: a message's ``images`` (file bytes, as the
history keeps them) become ``content`` parts, or never leave the machine.

- A remote that reads images (``[remote] images = true``): a message with pictures is sent as
  OpenAI content parts, the text first (``{"type": "text", ...}``, left out when empty), then one
  ``{"type": "image_url", "image_url": {"url": "data:MIME;base64,..."}}`` per picture, the MIME
  type read from the bytes' magic numbers. Earlier messages keep their pictures: a remote is
  stateless, and a question about "the first picture" needs it there.
- A remote that does not: no image byte is sent, ever. A message that had pictures goes as its
  text with a note that they were left out, so the remote does not answer as if it saw them.

:func:`turn_has_images` is the escalation's question: does this turn's user message carry any?
"""

from __future__ import annotations

import base64
from typing import Any

from localchat.engine.image_input import image_mime


def mime_type(data: bytes) -> str:
    """The picture's MIME type from its first bytes; ValueError for a format localchat never
    attaches (a programmer error: pictures are checked when they are attached)."""
    mime = image_mime(data)
    if mime is None:
        raise ValueError(f"not a JPEG, PNG, GIF or BMP picture (starts {data[:8]!r})")
    return mime


def data_url(data: bytes) -> str:
    return f"data:{mime_type(data)};base64,{base64.b64encode(data).decode('ascii')}"


def left_out_note(n_images: int) -> str:
    """What a remote that reads no images is told in place of a message's pictures."""
    what = "a picture" if n_images == 1 else f"{n_images} pictures"
    return f"[{what} attached here, not sent to this model]"


def with_images(messages: list[dict[str, Any]], *, reads_images: bool) -> list[dict[str, Any]]:
    """``messages`` with each ``images`` list turned into content parts (``reads_images``) or
    into a note; the other messages unchanged (see the module)."""
    return [_wire(m, reads_images) if m.get("images") else m for m in messages]


def turn_has_images(messages: list[dict[str, Any]]) -> bool:
    """Whether the turn's user message (the newest one: a tool round's reply follows it) has
    pictures."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return bool(message.get("images"))
    return False


def _wire(message: dict[str, Any], reads_images: bool) -> dict[str, Any]:
    images = message["images"]
    text = str(message.get("content") or "")
    rest = {k: v for k, v in message.items() if k not in ("images", "content")}
    if not reads_images:
        note = left_out_note(len(images))
        return {**rest, "content": f"{note}\n{text}" if text else note}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": data_url(data)}} for data in images]
    return {**rest, "content": parts}
