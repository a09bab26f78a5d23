"""Ollama's ``POST /api/generate`` in Ollama's shapes: one prompt completed, no conversation.

- A request's fields: ``model``, ``prompt`` (through the model's chat template as a user
  message after ``system``; as it is with ``raw``), ``suffix`` (the prompt is then the prefix of
  a gap filled with the model's fill-in-the-middle tokens), ``context`` (the token ids a previous
  reply returned: the prompt goes on after them), ``stream`` (true unless false, as Ollama),
  ``format``, ``options`` as ``/api/chat`` reads them, ``keep_alive`` (accepted), ``images``
  (base64, as ``ollama.generate(..., images=[...])`` sends them: the prompt then goes as a user
  message with its pictures, through the chat template, answered as ``/api/chat`` answers one;
  not with ``raw``, ``suffix`` or ``context``, whose tokens have no pictures). Refused with a
  400: ``template`` (the model's own is used), ``think``, ``logprobs``.
- No prompt at all (no suffix, no context) is Ollama's way to load a model: answered at once
  with ``done_reason: "load"`` (the model loads with the first request that needs it).
- Streamed as NDJSON: ``{"model", "created_at", "response", "done": false}`` lines, then one
  with ``done: true``, ``done_reason``, ``context`` (the prompt and reply tokens, for the next
  request) and the counts and durations ``/api/chat`` reports; or all of it in one body.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from localchat.serve.chat_request import ChatRequest, read_sampling
from localchat.serve.fields import field_of, integer, stops
from localchat.serve.http_errors import BadRequest
from localchat.serve.model_host import ServedModel
from localchat.serve.ollama_api import ChatShape, _line, _now
from localchat.serve.pieces import Ending, Piece
from localchat.serve.prompt_tokens import GeneratePrompt, token_ids
from localchat.serve.request_images import image_from_base64
from localchat.serve.tool_fields import answer_format


def parse_generate(body: dict[str, Any]) -> ChatRequest:
    """An ``/api/generate`` body as a ChatRequest with a prompt (BadRequest naming the field)."""
    for name, why in (("template", "the model's own chat template is used"),
                      ("think", "thinking is not supported on /api/generate (use /api/chat)"),
                      ("logprobs", "logprobs are not supported")):
        if body.get(name):
            raise BadRequest(f"{name}: {why} by localchat serve", name)
    options = field_of(body, "options", dict) or {}
    num_predict = integer(options, "num_predict", -2, "options.")
    stream = field_of(body, "stream", bool)
    context = body.get("context")
    prompt = GeneratePrompt(prompt=field_of(body, "prompt", str) or "",
                            suffix=field_of(body, "suffix", str) or None,  # "": no gap
                            raw=bool(field_of(body, "raw", bool)),
                            system=field_of(body, "system", str),
                            context=token_ids(context, "context") if context else ())
    images = field_of(body, "images", list)
    request = ChatRequest(
        model=field_of(body, "model", str),
        messages=[],
        stream=True if stream is None else stream,
        sampling=read_sampling(options, "options.", num_predict if num_predict is not None
                               and num_predict > 0 else None),
        stop=stops(options, "stop", "options."),
        answer_format=answer_format(body.get("format"), "format"),
        prompt=prompt,
    )
    return replace(request, messages=_with_pictures(prompt, images), prompt=None) if images else request


def _with_pictures(prompt: GeneratePrompt, images: list[Any]) -> list[dict[str, Any]]:
    """The prompt as a chat's user message carrying ``images`` (base64), after ``system``."""
    for name, given in (("raw", prompt.raw), ("suffix", prompt.suffix is not None),
                        ("context", bool(prompt.context))):
        if given:
            raise BadRequest(f"images: pictures go through the chat template, not with {name}",
                             "images")
    pictures = [image_from_base64(value, f"images[{k}]") for k, value in enumerate(images)]
    system = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return [*system, {"role": "user", "content": prompt.prompt, "images": pictures}]


def only_loads(request: ChatRequest) -> bool:
    """Whether ``request`` is Ollama's "load the model" (nothing to complete)."""
    prompt = request.prompt
    return isinstance(prompt, GeneratePrompt) and not (prompt.prompt or prompt.suffix
                                                       or prompt.context)


def load_body(model: ServedModel) -> dict[str, Any]:
    return {"model": model.tag, "created_at": _now(), "response": "", "done": True,
            "done_reason": "load"}


class GenerateShape(ChatShape):
    """One ``/api/generate`` reply (NDJSON lines, or one body) (``exchange.ReplyShape``)."""

    def piece(self, piece: Piece) -> bytes:
        thinking = {"thinking": piece.text} if piece.kind == "thinking" else {}
        return _line({"model": self._model, "created_at": _now(),
                      "response": piece.text if piece.kind == "content" else "", **thinking,
                      "done": False})

    def ending(self, ending: Ending) -> list[bytes]:
        if ending.error is not None:
            return super().ending(ending)
        return [_line(self._generated(ending, ""))]

    def whole(self, ending: Ending) -> dict[str, Any]:
        body = self._generated(ending, ending.content)
        return {**body, "thinking": ending.thinking} if ending.thinking else body

    def _generated(self, ending: Ending, response: str) -> dict[str, Any]:
        """``/api/chat``'s last line (its counts and durations) with a response for a message."""
        final = self._final(ending, {})
        del final["message"]
        return {**final, "response": response, "context": list(ending.tokens)}
