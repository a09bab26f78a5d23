"""llama-server's ``POST /infill`` (fill-in-the-middle for editors: llama.vim, llama.vscode) in
llama-server's shapes.

- A request's fields: ``input_prefix`` and ``input_suffix`` (the text around the cursor),
  ``input_extra`` (``[{"filename", "text"}]``: other files or recent edits, laid before the gap
  so that they stay cached while the user types), ``prompt`` (text typed before the cursor after
  the prefix), ``n_predict`` (-1: no limit but the server's; 0: prefill only, as llama.vim does to
  warm the cache), ``stream``, ``stop`` and the sampling fields (``chat_request``) at the top
  level. Others llama.vim sends (``samplers``, ``cache_prompt``, ``t_max_*``, ``id_slot``) are
  accepted and ignored. The layout and its budget are llama-server's (``prompt_tokens``).
- Answered: ``{"content", "stop": true, "stop_type", "model", "tokens_predicted",
  "tokens_evaluated", "tokens_cached", "truncated", "generation_settings", "timings"}``;
  streamed as ``data:`` events ``{"content", "stop": false}`` and a last one with
  ``stop: true``, the counts and ``timings`` (no ``[DONE]``, as llama-server's own API).
- A model without fill-in-the-middle tokens: a 400 naming it. Errors take OpenAI's shape, as
  llama-server's do.
"""

from __future__ import annotations

from typing import Any

from localchat.serve.chat_request import ChatRequest, read_sampling
from localchat.serve.fields import field_of, integer, shown, stops
from localchat.serve.http_errors import bad
from localchat.serve.model_host import ServedModel
from localchat.serve.openai_api import _event, error_body, server_timings
from localchat.serve.pieces import Ending, Piece
from localchat.serve.prompt_tokens import InfillPrompt


def parse_infill(body: dict[str, Any]) -> ChatRequest:
    """An ``/infill`` body as a ChatRequest with a prompt (BadRequest naming the field)."""
    n_predict = integer(body, "n_predict", -1)
    limit = None if n_predict is None or n_predict < 0 else max(1, n_predict)
    return ChatRequest(
        model=field_of(body, "model", str),
        messages=[],
        stream=bool(field_of(body, "stream", bool)),
        sampling=read_sampling(body, "", limit),
        stop=stops(body, "stop"),
        prompt=InfillPrompt(prefix=field_of(body, "input_prefix", str) or "",
                            suffix=field_of(body, "input_suffix", str) or "",
                            extra=_extra(body), prompt=field_of(body, "prompt", str) or "",
                            n_predict=-1 if n_predict is None else n_predict),
    )


def _extra(body: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    chunks = field_of(body, "input_extra", list) or []
    extra = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise bad(where, f"must be an object {{\"filename\", \"text\"}}, not {shown(chunk)}")
        extra.append((field_of(chunk, "filename", str, where + ".") or "tmp",
                      field_of(chunk, "text", str, where + ".") or ""))
    return tuple(extra)


class InfillShape:
    """One ``/infill`` answer for ``request``, by ``model`` (``exchange.ReplyShape``). With
    ``n_predict`` 0 the reply is not sent: the request only prefilled the cache."""

    stream_type = "text/event-stream"

    def __init__(self, request: ChatRequest, model: ServedModel) -> None:
        self._model = model.name
        recipe = request.prompt
        self._quiet = isinstance(recipe, InfillPrompt) and recipe.n_predict == 0

    def opening(self) -> bytes:
        return b""

    def piece(self, piece: Piece) -> bytes:
        return b"" if self._quiet else _event({"content": piece.text, "stop": False})

    def ending(self, ending: Ending) -> list[bytes]:
        if ending.error is not None:
            return [_event(error_body(ending.error))]
        return [_event(self._final(ending, ""))]

    def whole(self, ending: Ending) -> dict[str, Any]:
        return self._final(ending, "" if self._quiet else ending.thinking + ending.content)

    def _final(self, ending: Ending, content: str) -> dict[str, Any]:
        t = ending.timings
        return {"content": content, "stop": True, "model": self._model,
                "stop_type": "limit" if ending.finish_reason == "length" else "eos",
                "tokens_predicted": 0 if self._quiet else t.predicted_n,
                "tokens_evaluated": t.cache_n + t.prompt_n, "tokens_cached": t.cache_n,
                "truncated": False, "generation_settings": {"n_ctx": t.n_ctx},
                "timings": server_timings(t)}
