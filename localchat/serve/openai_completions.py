"""OpenAI's legacy completions (``POST /v1/completions``) in OpenAI's shapes, with llama-server's
``timings``: a prompt continued as it is, no chat template.

- A request's fields: ``model``, ``prompt`` (a string, or an array of token ids; an array of one
  of those too), ``suffix`` (the prompt is then the prefix of a gap filled with the model's
  fill-in-the-middle tokens, ``prompt_tokens``), ``stream``, ``stream_options.include_usage``,
  ``max_tokens`` (absent: the server's limit, as llama-server; not OpenAI's 16), ``stop`` and the sampling fields both APIs read (``chat_request``). What cannot
  be honoured is a 400 that says so: ``n`` or ``best_of`` > 1, several prompts, ``echo``,
  ``logprobs``.
- Answered: a ``text_completion`` (``choices[0].text``, ``finish_reason`` ``stop`` | ``length``,
  ``usage`` with ``prompt_tokens_details.cached_tokens``, ``timings``); streamed, ``data:``
  chunks of the same object, a last one with the finish reason and ``timings``, with
  ``include_usage`` one more with ``choices: []`` and the usage, then ``data: [DONE]``.

The prompt's cells are reused by exact token prefix: a prompt that extends the previous one
(the next keystroke in an editor) prefills only the new tokens (``timings.prompt_n``).
"""

from __future__ import annotations

import secrets
from typing import Any

from localchat.serve.chat_request import ChatRequest, read_sampling
from localchat.serve.fields import field_of, integer, shown, stops
from localchat.serve.http_errors import BadRequest, bad
from localchat.serve.model_host import ServedModel
from localchat.serve.openai_api import ChatShape, _event, server_timings, usage
from localchat.serve.pieces import Ending
from localchat.serve.prompt_tokens import TextPrompt, token_ids


def parse_completion(body: dict[str, Any]) -> ChatRequest:
    """A ``/v1/completions`` body as a ChatRequest with a prompt (BadRequest naming the field)."""
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise bad(name, "must be 1: localchat serve answers with one choice")
    if body.get("echo"):
        raise BadRequest("echo is not supported by localchat serve: the reply holds only the "
                         "completion (the prompt is yours already)", "echo")
    if body.get("logprobs") is not None:
        raise BadRequest("logprobs are not supported by localchat serve", "logprobs")
    options = field_of(body, "stream_options", dict) or {}
    return ChatRequest(
        model=field_of(body, "model", str),
        messages=[],
        stream=bool(field_of(body, "stream", bool)),
        sampling=read_sampling(body, "", integer(body, "max_tokens", 1)),
        stop=stops(body, "stop"),
        include_usage=bool(field_of(options, "include_usage", bool, "stream_options.")),
        prompt=_prompt(body),
    )


def _prompt(body: dict[str, Any]) -> TextPrompt:
    value = body.get("prompt")
    suffix = field_of(body, "suffix", str) or None  # "": no gap
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        if len(value) > 1:  # several prompts: OpenAI answers each, as n choices
            raise bad("prompt", f"holds {len(value)} prompts: localchat serve completes one "
                                "prompt per request")
        value = value[0]
    if isinstance(value, str):
        return TextPrompt(text=value, suffix=suffix)
    if isinstance(value, list):
        return TextPrompt(ids=token_ids(value, "prompt"), suffix=suffix)
    if value is None:
        raise bad("prompt", "is missing")
    raise bad("prompt", f"must be a string or an array of token ids, not {shown(value)}")


class CompletionShape(ChatShape):
    """One ``text_completion`` (or its chunks) for ``request``, answered by ``model``
    (``exchange.ReplyShape``): a chat completion's stream and ending, with text for a delta."""

    def __init__(self, request: ChatRequest, model: ServedModel) -> None:
        super().__init__(request, model)
        self._head.update(id=f"cmpl-{secrets.token_hex(12)}", object="text_completion")

    def _chunk(self, delta: dict[str, Any], finish: str | None = None,
               logprobs: dict[str, Any] | None = None, **extra: Any) -> bytes:
        # ``logprobs`` stays None: a completion that asks for them is refused (400) when read.
        text = "".join(delta.get(key, "") for key in ("reasoning_content", "content"))
        return _event({**self._head, "choices": [
            {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}], **extra})

    def opening(self) -> bytes:
        return b""  # no role chunk: a completion is text

    def whole(self, ending: Ending) -> dict[str, Any]:
        return {**self._head, "choices": [{"text": ending.thinking + ending.content, "index": 0,
                                           "logprobs": None, "finish_reason": ending.finish_reason}],
                "usage": usage(ending.timings), "timings": server_timings(ending.timings)}
