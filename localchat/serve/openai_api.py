"""The OpenAI API (``/v1/models``, ``/v1/chat/completions``) in OpenAI's shapes, with llama-server's
additions where clients read them.

- A request's fields: ``model, messages, stream, stream_options.include_usage, max_tokens |
  max_completion_tokens, temperature, top_p, stop, seed, frequency_penalty, presence_penalty``;
  llama-server's ``top_k, min_p, repeat_penalty`` and ``chat_template_kwargs.enable_thinking``;
  ``tools`` and ``tool_choice``, assistant messages with ``tool_calls`` and ``tool`` messages;
  ``response_format`` (``text``, ``json_object``, ``json_schema``: the reply is sampled in that
  shape). Message content is a string or an array of text parts. Unknown fields are ignored, as
  OpenAI's SDK sends many; what cannot be honoured (``n`` > 1, ``logprobs``, image parts, a
  schema that cannot be enforced) is a 400 that says so.
- Streamed: ``chat.completion.chunk`` events (a ``role`` delta first, then ``content`` deltas and
  a thinking model's ``reasoning_content`` deltas apart; the model's tool calls as
  ``tool_calls`` deltas, one per call with its ``index``, ``id``, ``type``, name and the
  arguments as JSON text), a last chunk with ``finish_reason`` (``stop`` | ``length`` |
  ``tool_calls``) and llama-server's ``timings``, with ``include_usage`` one more chunk with
  ``choices: []`` and the usage, then ``data: [DONE]``. The server never runs a tool.
- ``usage.prompt_tokens_details.cached_tokens``: the prompt tokens the cache served.
- Errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from localchat.events import Timings
from localchat.serve.http import Connection, Request
from localchat.serve.messages import message_list
from localchat.serve.reply import Ending, Piece, read_reply
from localchat.serve.request import (
    ApiError,
    ChatRequest,
    bad,
    field_of,
    integer,
    json_object,
    number,
    stops,
    thinking_switch,
)
from localchat.serve.tool_fields import answer_format, tool_choice_of, tools_of

if TYPE_CHECKING:
    from localchat.serve.app import ServeApp
    from localchat.serve.scheduler import Job


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """A ``/v1/chat/completions`` body as a ChatRequest (ApiError 400 naming the field)."""
    if body.get("n") not in (None, 1):
        raise bad("n", "must be 1: localchat serve answers with one choice")
    if body.get("logprobs"):
        raise ApiError(400, "logprobs are not supported by localchat serve", param="logprobs")
    shape = answer_format(field_of(body, "response_format", dict), "response_format")
    tools = tools_of(body)
    options = field_of(body, "stream_options", dict) or {}
    template_kwargs = field_of(body, "chat_template_kwargs", dict) or {}
    max_tokens = integer(body, "max_completion_tokens", 1)
    return ChatRequest(
        model=field_of(body, "model", str),
        messages=message_list(body, _content),
        stream=bool(field_of(body, "stream", bool)),
        max_tokens=max_tokens if max_tokens is not None else integer(body, "max_tokens", 1),
        temperature=number(body, "temperature", 0, 2),
        top_p=number(body, "top_p", 0, 1),
        top_k=integer(body, "top_k", 0),
        min_p=number(body, "min_p", 0, 1),
        repeat_penalty=number(body, "repeat_penalty", 0.01, 10),
        frequency_penalty=number(body, "frequency_penalty", -2, 2),
        presence_penalty=number(body, "presence_penalty", -2, 2),
        seed=integer(body, "seed", -(2**63), high=2**63 - 1),
        stop=stops(body, "stop"),
        thinking=thinking_switch(template_kwargs.get("enable_thinking"),
                                 "chat_template_kwargs.enable_thinking"),
        include_usage=bool(field_of(options, "include_usage", bool, "stream_options.")),
        tools=tools,
        tool_choice=tool_choice_of(body, tools),
        answer_format=shape,
    )


def _content(message: dict[str, Any], where: str) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where + "content", "must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}content[{j}]"
        if not isinstance(part, dict):
            raise bad(at, "must be an object such as {\"type\": \"text\", \"text\": ...}")
        kind = part.get("type")
        if kind != "text":
            raise ApiError(400, f"{at}: content of type {kind!r} is not supported by localchat "
                                "serve (text only)", param=at + ".type")
        text = field_of(part, "text", str, at + ".")
        texts.append(text or "")
    return "".join(texts)


# -- answers -----------------------------------------------------------------------------------

def error_body(error: ApiError) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": error.kind, "param": error.param,
                      "code": error.code}}


def models_body(app: ServeApp) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": model.name, "object": "model", "created": _mtime(model.path),
         "owned_by": "localchat"} for model in app.host.refresh()]}


def _mtime(path: Any) -> int:
    try:
        return int(path.stat().st_mtime)
    except OSError:
        return 0


def usage(timings: Timings) -> dict[str, Any]:
    prompt = timings.cache_n + timings.prompt_n
    return {"prompt_tokens": prompt, "completion_tokens": timings.predicted_n,
            "total_tokens": prompt + timings.predicted_n,
            "prompt_tokens_details": {"cached_tokens": timings.cache_n}}


def server_timings(t: Timings) -> dict[str, Any]:
    """llama-server's ``timings`` object."""
    return {"cache_n": t.cache_n, "prompt_n": t.prompt_n, "prompt_ms": round(t.prompt_ms, 3),
            "prompt_per_token_ms": round(t.prompt_ms / t.prompt_n, 3) if t.prompt_n else 0.0,
            "prompt_per_second": round(t.prompt_per_second, 3),
            "predicted_n": t.predicted_n, "predicted_ms": round(t.predicted_ms, 3),
            "predicted_per_token_ms": round(t.predicted_ms / t.predicted_n, 3) if t.predicted_n else 0.0,
            "predicted_per_second": round(t.predicted_per_second, 3)}


async def chat_completions(app: ServeApp, request: Request, connection: Connection) -> None:
    chat = parse_chat(json_object(request.body))
    job = app.start_job(chat, connection)
    ids = (f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), job.model.name)
    if chat.stream:
        await _stream(app, request, connection, job, ids)
    else:
        await _whole(app, request, connection, job, ids)


def _chunk(ids: tuple[str, int, str], delta: dict[str, Any], finish: str | None = None,
           **extra: Any) -> bytes:
    body = {"id": ids[0], "object": "chat.completion.chunk", "created": ids[1], "model": ids[2],
            "system_fingerprint": "localchat",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            **extra}
    return _event(body)


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n\n"


async def _stream(app: ServeApp, request: Request, connection: Connection, job: Job,
                  ids: tuple[str, int, str]) -> None:
    started = False
    async for item in read_reply(job, connection):
        if not started:
            await app.start_stream(request, connection, "text/event-stream")
            await connection.write(_chunk(ids, {"role": "assistant", "content": ""}))
            started = True
        if isinstance(item, Piece):
            key = "content" if item.kind == "content" else "reasoning_content"
            await connection.write(_chunk(ids, {key: item.text}))
            continue
        app.remember_calls(item)
        for index, call in enumerate(item.tool_calls):
            await connection.write(_chunk(ids, {"tool_calls": [{"index": index, **call.to_openai()}]}))
        await connection.write(_last_chunks(ids, item, job.request.include_usage))
        await connection.end_stream()


def _last_chunks(ids: tuple[str, int, str], ending: Ending, include_usage: bool) -> bytes:
    if ending.error is not None:
        return _event(error_body(ending.error)) + b"data: [DONE]\n\n"
    out = _chunk(ids, {}, ending.finish_reason, timings=server_timings(ending.timings))
    if include_usage:
        out += _event({"id": ids[0], "object": "chat.completion.chunk", "created": ids[1],
                       "model": ids[2], "system_fingerprint": "localchat", "choices": [],
                       "usage": usage(ending.timings)})
    return out + b"data: [DONE]\n\n"


async def _whole(app: ServeApp, request: Request, connection: Connection, job: Job,
                 ids: tuple[str, int, str]) -> None:
    async for item in read_reply(job, connection):
        if not isinstance(item, Ending):
            continue
        if item.error is not None:
            raise item.error
        app.remember_calls(item)
        message: dict[str, Any] = {"role": "assistant",
                                   "content": item.content or (None if item.tool_calls else "")}
        if item.thinking:
            message["reasoning_content"] = item.thinking
        if item.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in item.tool_calls]
        body = {"id": ids[0], "object": "chat.completion", "created": ids[1], "model": ids[2],
                "system_fingerprint": "localchat",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": item.finish_reason}],
                "usage": usage(item.timings), "timings": server_timings(item.timings)}
        await app.send_json(request, connection, 200, body)
