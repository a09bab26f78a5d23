"""Pictures in chat requests: OpenAI ``image_url`` content parts and Ollama's ``images``, read as
the encoded bytes the engine takes (a message's ``"images"``).

The server never fetches a URL or reads a file a request names (a request must not make it reach
the network or the disk): only ``data:`` URLs with base64 (OpenAI) and base64 strings (Ollama)
are read; an ``http(s)://`` or ``file://`` URL is a 400 naming the field. Each picture is checked
as ``ask --image`` checks a file (``engine.image_input.check_image``: its format, a truncated
file, its size in pixels) before any model sees it, and a model that does not read images
refuses them (``check_model_reads``) before the request waits in the queue.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from localchat.engine.image_input import MAX_IMAGE_BYTES, check_image
from localchat.errors import UserError
from localchat.serve.fields import shown
from localchat.serve.http_errors import bad

NO_FETCH = ("the server never fetches a URL or reads a file a request names: send the picture "
            "as a data: URL (data:image/png;base64,...)")


def image_from_url_part(part: dict[str, Any], at: str) -> bytes:
    """The picture of an OpenAI ``{"type": "image_url", "image_url": {"url": ...}}`` part."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    where = f"{at}.image_url.url" if isinstance(value, dict) else f"{at}.image_url"
    if not isinstance(url, str):
        raise bad(where, f"must be a data: URL string, not {shown(url)}")
    head, comma, data = url.partition(",")
    if not head.lower().startswith("data:"):
        scheme = url.split(":", 1)[0].lower() if ":" in url[:12] else ""
        kind = f"an {scheme}: URL" if scheme in ("http", "https") else (
            "a file: URL" if scheme == "file" else "not a data: URL")
        raise bad(where, f"is {kind}; {NO_FETCH}")
    if not comma or not head.lower().endswith(";base64"):
        raise bad(where, "must be a base64 data: URL (data:image/png;base64,...)")
    return _picture(_base64(data, where), where)


def image_from_base64(value: Any, at: str) -> bytes:
    """One of Ollama's ``images``: base64 (a data: URL is taken too, as Ollama's own does)."""
    if not isinstance(value, str):
        raise bad(at, f"must be a base64 string, not {shown(value)}")
    if value[:5].lower() == "data:":
        return image_from_url_part({"image_url": value}, at)
    if value[:8].lower() in ("http://", "https://") or value[:7].lower() == "file://":
        raise bad(at, f"is a URL; {NO_FETCH}")
    return _picture(_base64(value, at), at)


def _base64(text: str, where: str) -> bytes:
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise bad(where, f"is over {MAX_IMAGE_BYTES // 1024**2} MB of picture")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad(where, "is not valid base64") from None


def _picture(data: bytes, where: str) -> bytes:
    try:
        check_image(data, "the picture")
    except UserError as exc:
        raise bad(where, str(exc).removeprefix("the picture ")) from None
    return data


def check_model_reads(model: Any, messages: list[dict[str, Any]]) -> None:
    """A 400 (``messages``) when ``messages`` hold pictures that ``model`` (a ``ServedModel``)
    cannot read here (``engine.vision.images_problem``)."""
    if not any(m.get("images") for m in messages):
        return
    from localchat.engine.vision import images_problem

    problem = images_problem(model.spec)
    if problem:
        raise bad("messages", problem)
