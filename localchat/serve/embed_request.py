"""An embeddings request as the server runs it (:class:`EmbedRequest`), read from each API's
shape: OpenAI's ``/v1/embeddings`` (:func:`parse_openai`), Ollama's ``/api/embed``
(:func:`parse_ollama`) and its older ``/api/embeddings`` (:func:`parse_ollama_legacy`).

Every problem is a 400 naming the field and the limit, checked before anything is queued: at
most :data:`MAX_INPUTS` inputs and :data:`MAX_TEXT_BYTES` of text (the body cap refuses more
first, unless raised), no empty input, texts or token ids only. What needs the model (token ids
inside its vocabulary, inputs within its context) is checked when it runs (``embeddings``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localchat.serve.fields import field_of, integer, shown
from localchat.serve.http_errors import bad

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request
MAX_TEXT_BYTES = 8 * 1024**2
# Tokens one request may embed, all inputs together (OpenAI's limit): a bound on the work one
# request queues ahead of everyone else (~10 s on a laptop CPU for a small model).
MAX_TOKENS = 300_000

Input = str | list[int]  # a text, or the token ids of one


@dataclass(frozen=True)
class EmbedRequest:
    """What to embed and how to answer. ``truncate``: an input over the model's context is cut
    to it (Ollama's default) instead of refused (400, as OpenAI does)."""

    model: str | None
    inputs: list[Input]
    truncate: bool = False
    base64: bool = False  # OpenAI's encoding_format "base64": little-endian float32 bytes
    dimensions: int | None = None  # refused unless the model's own (no vector is cut)
    field: str = "input"  # where the inputs came from, for errors
    listed: bool = True  # as an array of inputs (errors name input[i]), not one input


def parse_openai(body: dict[str, Any]) -> EmbedRequest:
    """A ``/v1/embeddings`` body: ``input`` a text, a list of texts, a list of token ids or a
    list of such lists; ``encoding_format`` "float" or "base64"; ``dimensions``; ``user``
    ignored."""
    encoding = field_of(body, "encoding_format", str) or "float"
    if encoding not in ("float", "base64"):
        raise bad("encoding_format", f"must be \"float\" or \"base64\", not {shown(encoding)}")
    inputs, listed = _inputs(body, "input", True)
    return EmbedRequest(model=field_of(body, "model", str), inputs=inputs, listed=listed,
                        base64=encoding == "base64", dimensions=integer(body, "dimensions", 1))


def parse_ollama(body: dict[str, Any]) -> EmbedRequest:
    """An ``/api/embed`` body: ``input`` a text or a list of texts, ``truncate`` (default true),
    ``dimensions``; ``keep_alive`` and ``options`` are ignored (the context is the server's)."""
    truncate = field_of(body, "truncate", bool)
    inputs, listed = _inputs(body, "input", False)
    return EmbedRequest(model=field_of(body, "model", str), inputs=inputs, listed=listed,
                        truncate=True if truncate is None else truncate,
                        dimensions=integer(body, "dimensions", 1))


def parse_ollama_legacy(body: dict[str, Any]) -> EmbedRequest:
    """An ``/api/embeddings`` body: one text in ``prompt`` (cut to the context if longer)."""
    inputs, _ = _inputs(body, "prompt", False)
    return EmbedRequest(model=field_of(body, "model", str), inputs=inputs, truncate=True,
                        field="prompt", listed=False)


def _inputs(body: dict[str, Any], key: str, tokens_allowed: bool) -> tuple[list[Input], bool]:
    """The inputs, and whether they came as an array of inputs."""
    value = body.get(key)
    if value is None:
        raise bad(key, "is missing")
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and key != "prompt":
        one_input = tokens_allowed and value and all(_is_int(v) for v in value)  # token ids
        items = [value] if one_input else value
    else:
        kinds = "a string or an array of strings" + (" or of token ids" if tokens_allowed else "")
        raise bad(key, f"must be {kinds if key != 'prompt' else 'a string'}, not {shown(value)}")
    if not items:
        raise bad(key, "is empty: give at least one text")
    if len(items) > MAX_INPUTS:
        raise bad(key, f"holds {len(items):,} inputs; at most {MAX_INPUTS:,} go in one request")
    listed = items is value
    inputs = [_one(item, f"{key}[{i}]" if listed else key, tokens_allowed)
              for i, item in enumerate(items)]
    if sum(len(t.encode("utf-8")) for t in inputs if isinstance(t, str)) > MAX_TEXT_BYTES:
        raise bad(key, f"holds more than {MAX_TEXT_BYTES // 1024**2} MB of text; send it in parts")
    if sum(len(item) for item in inputs if isinstance(item, list)) > MAX_TOKENS:
        raise bad(key, f"holds more than {MAX_TOKENS:,} token ids; at most that many go in one "
                       "request")
    return inputs, listed


def _one(item: Any, where: str, tokens_allowed: bool) -> Input:
    if isinstance(item, str):
        if not item:
            raise bad(where, "is an empty string; every input needs some text")
        return item
    if tokens_allowed and isinstance(item, list):
        if not item:
            raise bad(where, "is an empty array of token ids")
        for j, token in enumerate(item):
            if not _is_int(token) or token < 0:
                raise bad(f"{where}[{j}]", f"must be a token id (an integer from 0), not "
                                           f"{shown(token)}")
        return item
    kinds = "a string or an array of token ids" if tokens_allowed else "a string"
    raise bad(where, f"must be {kinds}, not {shown(item)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
