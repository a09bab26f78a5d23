"""Server-sent events as OpenAI-compatible servers send them, decoded into :class:`StreamChunk`.

Three layers: :func:`iter_lines` cuts the body's bytes into lines, :func:`iter_sse_data` turns
lines into event payloads following the SSE rules that matter here (``data:`` fields joined by
newlines, a blank line ends an event, ``:`` comments and other fields ignored), and
:func:`decode_chunk` turns one payload into what the client acts on.

What a remote can make us hold is bounded: a line or an event over :data:`MAX_EVENT_BYTES` is
:class:`StreamTooLarge`, raised as soon as the buffer passes the cap (never after reading the
whole line). How long one event may take is the client's rule (``client.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DONE_SENTINEL = "[DONE]"

# One chat.completion.chunk is a few hundred bytes, a long reasoning or tool delta a few KB; even
# a whole reply sent as one chunk stays far below this. 4 MiB leaves room for any real server and
# bounds what a broken or hostile one makes us hold (a 300 MB line once took 1.5 GB of memory).
MAX_EVENT_BYTES = 4 * 1024 * 1024

_LINE_END = re.compile(rb"\r\n|\r|\n")


class RemoteStreamError(Exception):
    """The remote sent something other than a chat completion stream. Message: one line."""


class StreamTooLarge(RemoteStreamError):
    """One line or event passed :data:`MAX_EVENT_BYTES`. Message: what was too large."""


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
    chat: bool = False  # a chat-completion chunk: it had a "choices" list (the usage one: empty)
    tool_deltas: tuple[dict[str, Any], ...] = ()  # delta.tool_calls entries, as sent


def iter_lines(chunks: Iterable[bytes], max_bytes: int = MAX_EVENT_BYTES) -> Iterator[str]:
    """The lines in a stream of byte chunks (CR, LF or CRLF ends one), decoded as UTF-8.
    Raises :class:`RemoteStreamError` once an unfinished line holds more than ``max_bytes``."""
    pending = bytearray()
    for data in chunks:
        pending += data
        start = 0
        for end in _LINE_END.finditer(pending):
            if end.group() == b"\r" and end.end() == len(pending):
                break  # maybe the first half of a CRLF: wait for the next chunk
            yield pending[start:end.start()].decode("utf-8", errors="replace")
            start = end.end()
        del pending[:start]
        if len(pending) > max_bytes:
            raise StreamTooLarge(f"a line over {_mib(max_bytes)} without an end")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", errors="replace")


def iter_sse_data(lines: Iterable[str], max_bytes: int = MAX_EVENT_BYTES) -> Iterator[str]:
    """Yield the data payload of each event in ``lines`` (line terminators already removed).
    Raises :class:`RemoteStreamError` once one event's data passes ``max_bytes`` (counted as
    characters, close enough for a cap).

    An event still open when the lines end is yielded too: servers that close the connection
    right after the last ``data:`` line without a blank line still delivered it.
    """
    data: list[str] = []
    size = 0
    for line in lines:
        line = line.rstrip("\r")
        if not line:
            if data:
                yield "\n".join(data)
                data, size = [], 0
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
            size += len(data[-1]) + 1
            if size > max_bytes:
                raise StreamTooLarge(f"an event over {_mib(max_bytes)}")
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
        raise RemoteStreamError(f"remote sent a malformed stream chunk: {preview(payload)}") from None
    if not isinstance(obj, dict):
        raise RemoteStreamError(f"remote sent a malformed stream chunk: {preview(payload)}")
    if obj.get("error"):
        raise RemoteStreamError(f"remote error: {error_text(obj['error'])}")
    content, reasoning, finish_reason = "", "", None
    tool_deltas: tuple[dict[str, Any], ...] = ()
    choices = obj.get("choices")  # the usage chunk has "choices": []
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        # "message": a server that sends a whole completion as one event of its stream.
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
        if isinstance(delta, dict):
            content = _text(delta.get("content"))
            reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                tool_deltas = tuple(c for c in calls if isinstance(c, dict))
        finish_reason = choice.get("finish_reason")
    return StreamChunk(
        content=content,
        reasoning=reasoning,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage=_usage(obj.get("usage")),
        model=model if isinstance(model := obj.get("model"), str) else "",
        chat=isinstance(choices, list),
        tool_deltas=tool_deltas,
    )


def _text(value: Any) -> str:
    """A delta's text: a string, or a list of content parts (``{"type": "text", "text": ...}``)
    as some servers send; anything else carries none."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part["text"] for part in value
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def error_text(error: Any) -> str:
    """The human part of an OpenAI-style error (``{"message": ...}``, or a bare string), one line."""
    if isinstance(error, dict):
        error = error.get("message") or error.get("type") or error.get("code") or json.dumps(error)
    return preview(str(error), limit=200)


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    return Usage(
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
    )


def preview(text: str, limit: int = 80) -> str:
    """``text`` on one line (runs of white space as one space), cut to ``limit`` characters."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / (1024 * 1024):g} MB"
