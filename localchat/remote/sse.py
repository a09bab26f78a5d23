"""Server-sent events as OpenAI-compatible servers send them, decoded into :class:`StreamChunk`.

Two layers: :func:`iter_sse_data` turns lines into event payloads following the SSE rules that
matter here (``data:`` fields joined by newlines, a blank line ends an event, ``:`` comments and
other fields ignored); :func:`decode_chunk` turns one payload into what the client acts on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DONE_SENTINEL = "[DONE]"


class RemoteStreamError(Exception):
    """The remote sent something other than a chat completion stream. Message: one line."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True)
class StreamChunk:
    """One decoded payload. Any field may be empty: a role-only delta has no content, the usage
    chunk has no choices, and the ``[DONE]`` sentinel only sets ``done``."""

    content: str = ""
    reasoning: str = ""  # delta.reasoning_content (llama.cpp server, vLLM, DeepSeek) or .reasoning
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str = ""
    done: bool = False


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """Yield the data payload of each event in ``lines`` (line terminators already removed).

    An event still open when the lines end is yielded too: servers that close the connection
    right after the last ``data:`` line without a blank line still delivered it.
    """
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
        # "event", "id", "retry" and unknown fields carry nothing a chat stream needs.
    if data:
        yield "\n".join(data)


def decode_chunk(payload: str) -> StreamChunk:
    """Decode one event payload. Raises :class:`RemoteStreamError` for an error object (servers
    report failures inside a 200 stream that way) or for a payload that is not a JSON object."""
    if payload.strip() == DONE_SENTINEL:
        return StreamChunk(done=True)
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        raise RemoteStreamError(f"remote sent a malformed stream chunk: {_preview(payload)}") from None
    if not isinstance(obj, dict):
        raise RemoteStreamError(f"remote sent a malformed stream chunk: {_preview(payload)}")
    if obj.get("error"):
        raise RemoteStreamError(f"remote error: {error_text(obj['error'])}")
    content, reasoning, finish_reason = "", "", None
    choices = obj.get("choices") or []  # the usage chunk has "choices": []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        finish_reason = choice.get("finish_reason")
    return StreamChunk(
        content=content if isinstance(content, str) else "",
        reasoning=reasoning if isinstance(reasoning, str) else "",
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage=_usage(obj.get("usage")),
        model=model if isinstance(model := obj.get("model"), str) else "",
    )


def error_text(error: Any) -> str:
    """The human part of an OpenAI-style error (``{"message": ...}``, or a bare string), one line."""
    if isinstance(error, dict):
        error = error.get("message") or error.get("type") or error.get("code") or json.dumps(error)
    return _preview(str(error), limit=200)


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    return Usage(
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
    )


def _preview(text: str, limit: int = 80) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"
