"""Images in the engine's per-message records: a message's images become placeholder tokens.

A message may carry ``"images": [bytes, ...]`` (encoded files). Before a turn is laid out, each
image becomes a tag in the message's content (``<__image:SHA256__>`` plus a newline, before the
text), so a cached record matches a message only when its text *and* its pictures are the same.
When a tag is tokenized it becomes the projector's tokens for that picture: one placeholder id per
image token, ``-(1 + (h << 16) + i)`` with ``h`` 46 bits of the image's SHA-256 and ``i`` the
token's index in the image. Placeholders are plain ints in the record's token list, so the
exact-prefix reuse (``reuse.fill_cache``, ``ConversationCache.exact_n``) treats them as any other
tokens: the same picture matches cell for cell, a different one breaks the prefix at its first
token, and a snapshot keeps them as it keeps text. Prefill (``kv.prefill``) evaluates a run of
placeholders as one image, through the projector, never a part of one (``image_safe_cut``).

Everything here is plain logic with no model: ``projector_runtime`` makes the tokens.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

TAG_OPEN = "<__image:"
_TAG = re.compile(r"<__image:([0-9a-f]{64})__>")
_INDEX_BITS = 16
MAX_IMAGE_TOKENS = 1 << _INDEX_BITS  # tokens one image may take (its index must fit)
_HASH_BITS = 46  # with the index, a placeholder stays within a signed 64-bit integer


def image_tag(sha256: str) -> str:
    return f"{TAG_OPEN}{sha256}__>"


def digest(data: bytes) -> str:
    """The image's key: the SHA-256 of its file bytes (as libmtmd's own chunk id)."""
    return hashlib.sha256(data).hexdigest()


def placeholders(sha256: str, n_tokens: int) -> list[int]:
    """The record's tokens for one image of ``n_tokens`` tokens."""
    if not 0 < n_tokens <= MAX_IMAGE_TOKENS:
        raise ValueError(f"an image of {n_tokens} tokens")
    h = int(sha256[:16], 16) >> (64 - _HASH_BITS)
    return [-(1 + (h << _INDEX_BITS) + i) for i in range(n_tokens)]


def is_placeholder(token: int) -> bool:
    return token < 0


def _index(token: int) -> int:
    return (-token - 1) & (MAX_IMAGE_TOKENS - 1)


def image_key(token: int) -> int:
    """The hash bits a placeholder carries (equal for every token of one image)."""
    return (-token - 1) >> _INDEX_BITS


def key_of(sha256: str) -> int:
    return image_key(placeholders(sha256, 1)[0])


def image_run(tokens: list[int], start: int) -> int:
    """How many tokens from ``start`` belong to the image that begins there (0: a text token)."""
    if start >= len(tokens) or not is_placeholder(tokens[start]):
        return 0
    first = tokens[start]
    if _index(first) != 0:
        raise ValueError("a prefill may not start inside an image")
    end = start + 1
    while end < len(tokens) and tokens[end] == first - (end - start):
        end += 1
    return end - start


def next_image(tokens: list[int], start: int) -> int:
    """The index of the first placeholder at or after ``start`` (``len(tokens)``: none)."""
    for i in range(start, len(tokens)):
        if tokens[i] < 0:
            return i
    return len(tokens)


def image_safe_cut(tokens: list[int], n: int) -> int:
    """``n`` (a number of leading cells to keep), moved back to the start of the image it would
    cut, if any: an image's cells are reused whole or not at all."""
    while 0 < n < len(tokens) and is_placeholder(tokens[n]) and _index(tokens[n]) != 0:
        n -= 1
    return n


def count_image_tokens(tokens: list[int]) -> int:
    return sum(1 for t in tokens if t < 0)


@dataclass(frozen=True)
class TurnImages:
    """The images of a turn's messages, by SHA-256 (the bytes, for the projector to read)."""

    by_sha: dict[str, bytes]

    def __bool__(self) -> bool:
        return bool(self.by_sha)


def with_image_tags(messages: list[dict]) -> tuple[list[dict], TurnImages]:
    """``messages`` as the template renders them (each message's images as tags before its text;
    the ``images`` key dropped) and the images they hold. A tag typed in a message's own text is
    defused (a space after its opening), so only attached pictures are read as pictures."""
    shaped: list[dict] = []
    images: dict[str, bytes] = {}
    for message in messages:
        content = message.get("content")
        pictures = message.get("images") or ()
        if isinstance(content, str) and TAG_OPEN in content:
            content = content.replace(TAG_OPEN, "<__image :")
        if not pictures and content is message.get("content"):
            shaped.append(message)
            continue
        tags = []
        for data in pictures:
            sha = digest(bytes(data))
            images[sha] = bytes(data)
            tags.append(image_tag(sha) + "\n")
        rest = {k: v for k, v in message.items() if k != "images"}
        rest["content"] = "".join(tags) + (content or "")
        shaped.append(rest)
    return shaped, TurnImages(images)


def has_images(messages: list[dict]) -> bool:
    return any(message.get("images") for message in messages)


Tokenize = Callable[[str, bool], list[int]]


def tokenize_with_images(tokenize: Tokenize, image_tokens: Callable[[str], list[int]],
                         images: TurnImages) -> Tokenize:
    """``tokenize`` for prompt text that may hold image tags: text between tags is tokenized as
    before, each tag of one of ``images`` becomes ``image_tokens(sha)`` (its placeholders, with any
    wrapper tokens the projector adds)."""
    if not images:
        return tokenize

    def tokens(text: str, at_start: bool) -> list[int]:
        if TAG_OPEN not in text:
            return tokenize(text, at_start)
        out: list[int] = []
        pos = 0
        for match in _TAG.finditer(text):
            sha = match.group(1)
            if sha not in images.by_sha:
                continue  # not a picture of this turn: stays text
            if match.start() > pos:
                out += tokenize(text[pos:match.start()], at_start and pos == 0)
            out += image_tokens(sha)
            pos = match.end()
        if pos < len(text):
            out += tokenize(text[pos:], at_start and pos == 0)
        return out

    return tokens
