"""The OpenAI API (``/v1/models``, ``/v1/chat/completions``) in OpenAI's shapes, with llama-server's
additions where clients read them.

- A request's fields: ``model, messages, stream, stream_options.include_usage, max_tokens |
  max_completion_tokens, temperature, top_p, stop, seed, frequency_penalty, presence_penalty``;
  llama-server's ``top_k, min_p, repeat_penalty`` and ``chat_template_kwargs.enable_thinking``;
  ``tools`` and ``tool_choice``, assistant messages with ``tool_calls`` and ``tool`` messages;
  ``response_format`` (``text``, ``json_object``, ``json_schema``: the reply is sampled in that
  shape), or llama-server's ``grammar`` (GBNF) or ``json_schema`` in its place
  (``shape_fields``); ``logprobs`` and ``top_logprobs`` (``logprob_fields``). Message content is
  a string or an array of text parts. Unknown fields are ignored, as OpenAI's SDK sends many;
  what cannot be honoured (``n`` > 1, image parts, a schema that cannot be enforced) is a 400
  that says so.
- Streamed: ``chat.completion.chunk`` events (a ``role`` delta first, then ``content`` deltas and
  a thinking model's ``reasoning_content`` deltas apart; the model's tool calls as
  ``tool_calls`` deltas, one per call with its ``index``, ``id``, ``type``, name and the
  arguments as JSON text), a last chunk with ``finish_reason`` (``stop`` | ``length`` |
  ``tool_calls``) and llama-server's ``timings``, with ``include_usage`` one more chunk with
  ``choices: []`` and the usage, then ``data: [DONE]``. The server never runs a tool.
- ``usage.prompt_tokens_details.cached_tokens``: the prompt tokens the cache served.
- Errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status (also for a
  request that cannot be read, whatever its path).

Only the shapes live here (a request's fields -> ``ChatRequest``, a reply's pieces and ending ->
bytes, an error -> a body); ``exchange`` runs the request and ``routes`` wires the paths.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from localchat.events import Timings
from localchat.serve.chat_request import ChatRequest, read_sampling
from localchat.serve.fields import field_of, integer, stops, thinking_switch
from localchat.serve.http_errors import BadRequest, ServeError, bad
from localchat.serve.logprob_fields import logprobs_body, logprobs_of
from localchat.serve.model_host import ServedModel
from localchat.serve.pieces import Ending, Piece
from localchat.serve.request_images import image_from_url_part
from localchat.serve.request_messages import message_list
from localchat.serve.shape_fields import answer_shape
from localchat.serve.tool_fields import tool_choice_of, tools_of


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """A ``/v1/chat/completions`` body as a ChatRequest (BadRequest naming the field)."""
    if body.get("n") not in (None, 1):
        raise bad("n", "must be 1: localchat serve answers with one choice")
    shape = answer_shape(body)
    tools = tools_of(body)
    options = field_of(body, "stream_options", dict) or {}
    template_kwargs = field_of(body, "chat_template_kwargs", dict) or {}
    max_tokens = integer(body, "max_completion_tokens", 1)
    return ChatRequest(
        model=field_of(body, "model", str),
        messages=message_list(body, _content),
        stream=bool(field_of(body, "stream", bool)),
        sampling=read_sampling(body, "", max_tokens if max_tokens is not None
                               else integer(body, "max_tokens", 1)),
        stop=stops(body, "stop"),
        thinking=thinking_switch(template_kwargs.get("enable_thinking"),
                                 "chat_template_kwargs.enable_thinking"),
        include_usage=bool(field_of(options, "include_usage", bool, "stream_options.")),
        tools=tools,
        tool_choice=tool_choice_of(body, tools),
        answer_format=shape,
        logprobs=logprobs_of(body),
    )


def _content(message: dict[str, Any], where: str) -> str | tuple[str, list[bytes]]:
    """A message's text, or (text, pictures) when it has ``image_url`` parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where + "content", "must be a string or an array of text and image_url parts")
    texts, images = [], []
    for j, part in enumerate(content):
        at = f"{where}content[{j}]"
        if not isinstance(part, dict):
            raise bad(at, "must be an object such as {\"type\": \"text\", \"text\": ...}")
        kind = part.get("type")
        if kind == "image_url":
            images.append(image_from_url_part(part, at))
            continue
        if kind != "text":
            raise BadRequest(f"{at}: content of type {kind!r} is not supported by localchat "
                             "serve (text and image_url)", at + ".type")
        text = field_of(part, "text", str, at + ".")
        texts.append(text or "")
    return ("".join(texts), images) if images else "".join(texts)


# -- answers -----------------------------------------------------------------------------------

def error_body(error: ServeError) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": error.kind, "param": error.param,
                      "code": error.code}}


def models_body(models: list[ServedModel]) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": model.name, "object": "model", "created": _mtime(model.path),
         "owned_by": "localchat"} for model in models]}


def _mtime(path: Path) -> int:
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


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class ChatShape:
    """One ``chat.completion`` (or its chunks) for ``chat``, answered by ``model``
    (``exchange.ReplyShape``)."""

    stream_type = "text/event-stream"

    def __init__(self, chat: ChatRequest, model: ServedModel) -> None:
        self._head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion.chunk",
                      "created": int(time.time()), "model": model.name,
                      "system_fingerprint": "localchat"}
        self._include_usage = chat.include_usage
        self._logprobs = chat.logprobs is not None
        self._logprobs_sent = 0  # of the answer's tokens, those whose chunk has gone

    def _chunk(self, delta: dict[str, Any], finish: str | None = None,
               logprobs: dict[str, Any] | None = None, **extra: Any) -> bytes:
        return _event({**self._head, "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}], **extra})

    def opening(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def piece(self, piece: Piece) -> bytes:
        delta = {"content" if piece.kind == "content" else "reasoning_content": piece.text}
        if not self._logprobs or piece.kind != "content":
            return self._chunk(delta)
        self._logprobs_sent += len(piece.logprobs)
        return self._chunk(delta, logprobs=logprobs_body(piece.logprobs))

    def ending(self, ending: Ending) -> list[bytes]:
        calls = [self._chunk({"tool_calls": [{"index": index, **call.to_openai()}]})
                 for index, call in enumerate(ending.tool_calls)]
        if ending.error is not None:
            return [*calls, _event(error_body(ending.error)) + _DONE]
        rest = ending.logprobs[self._logprobs_sent:]  # tokens no text went out with (a call's)
        last = self._chunk({}, ending.finish_reason, logprobs_body(rest) if rest else None,
                           timings=server_timings(ending.timings))
        if self._include_usage:
            last += _event({**self._head, "choices": [], "usage": usage(ending.timings)})
        return [*calls, last + _DONE]

    def whole(self, ending: Ending) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant",
                                   "content": ending.content or (None if ending.tool_calls else "")}
        if ending.thinking:
            message["reasoning_content"] = ending.thinking
        if ending.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in ending.tool_calls]
        return {**self._head, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "logprobs": logprobs_body(
                    ending.logprobs) if self._logprobs else None,
                             "finish_reason": ending.finish_reason}],
                "usage": usage(ending.timings), "timings": server_timings(ending.timings)}
