"""The Ollama API (``/api/tags``, ``/api/ps``, ``/api/version``, ``/api/show``, ``/api/chat``) in
Ollama's shapes, so Ollama-only clients (the ``ollama`` Python library, oterm, editor plugins)
work unchanged. A model's ``digest`` is its file's sha256 (``digests``).

- ``/api/chat``: ``model, messages, stream`` (true unless false, as Ollama), ``think``,
  ``options`` (``temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
  frequency_penalty, presence_penalty``; others, such as ``num_ctx``, are ignored: the context is
  the server's), ``keep_alive`` (accepted: one model stays loaded until another is asked for).
  ``tools`` (the model's calls come back as ``message.tool_calls``, ``{"function": {"name",
  "arguments": {...}}}``; the server never runs a tool), assistant messages with ``tool_calls``
  and ``tool`` messages (``tool_name``), ``format`` (``"json"`` or a JSON Schema: the reply is
  sampled in that shape). Streamed as NDJSON: ``message{role, content, thinking}`` lines (the
  calls in one of their own before the last), then one with ``done: true``, ``done_reason`` and
  the counts and durations (ns) Ollama reports; ``prompt_eval_count`` is what was evaluated, as
  in Ollama (the cached part is not counted again). ``images`` (base64) go with their message
  (``request_images``).
- Errors: ``{"error": "message"}`` with the HTTP status.

Only the shapes live here (a request's fields -> ``ChatRequest``, a reply's pieces and ending ->
bytes, an error -> a body, the model listings); ``exchange`` runs the request and ``routes``
wires the paths.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache
from typing import Any

from localchat import __version__
from localchat.serve.chat_request import ChatRequest, read_sampling
from localchat.serve.digests import digest_of
from localchat.serve.fields import field_of, integer, stops, thinking_switch
from localchat.serve.http_errors import ServeError, bad
from localchat.serve.model_host import ModelHost, ServedModel
from localchat.serve.pieces import Ending, Piece
from localchat.serve.request_images import image_from_base64
from localchat.serve.request_messages import message_list
from localchat.serve.tool_fields import answer_format, tools_of

# The Ollama API version these routes follow (clients compare it to enable features such as
# ``think``); localchat's own version is reported beside it.
OLLAMA_API_VERSION = "0.12.0"


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """An ``/api/chat`` body as a ChatRequest (BadRequest naming the field)."""
    shape = answer_format(body.get("format"), "format")
    options = field_of(body, "options", dict) or {}
    num_predict = integer(options, "num_predict", -2, "options.")
    stream = field_of(body, "stream", bool)
    return ChatRequest(
        model=field_of(body, "model", str),
        messages=message_list(body, _content),
        stream=True if stream is None else stream,
        sampling=read_sampling(options, "options.", num_predict if num_predict is not None
                               and num_predict > 0 else None),
        stop=stops(options, "stop", "options."),
        thinking=thinking_switch(body.get("think"), "think"),
        tools=tools_of(body),
        answer_format=shape,
    )


def _content(message: dict[str, Any], where: str) -> str | tuple[str, list[bytes]]:
    """A message's text, or (text, pictures) when it has ``images`` (base64)."""
    text = field_of(message, "content", str, where) or ""
    images = field_of(message, "images", list, where)
    if not images:
        return text
    return text, [image_from_base64(value, f"{where}images[{k}]")
                  for k, value in enumerate(images)]


def error_body(error: ServeError) -> dict[str, Any]:
    return {"error": error.message}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# -- model listings ----------------------------------------------------------------------------

def tags_body(models: list[ServedModel]) -> dict[str, Any]:
    """``/api/tags``: every served model (hashes a file not hashed before: off the loop)."""
    return {"models": [_listing(model, digest_of(model)) for model in models]}


# A model stays loaded until a request asks for another: no time unloads it (Ollama shows a
# keep_alive of -1 as a date this far away).
_NEVER = "2318-11-18T00:00:00Z"


def ps_body(host: ModelHost) -> dict[str, Any]:
    """``/api/ps``: the loaded model (none while it loads or after it failed), its bytes in GPU
    memory estimated by the share of layers offloaded (0 on the CPU)."""
    model, engine = host.loaded, host.engine
    if model is None or engine is None:
        return {"models": []}
    listing = _listing(model, digest_of(model))
    info = engine.info
    offloaded = info.gpu_layers / info.n_layers if info is not None and info.n_layers else 0.0
    return {"models": [{"name": listing["name"], "model": listing["model"],
                        "size": listing["size"], "digest": listing["digest"],
                        "details": listing["details"], "expires_at": _NEVER,
                        "size_vram": int(listing["size"] * min(offloaded, 1.0)),
                        "context_length": engine.n_ctx}]}


def version_body() -> dict[str, Any]:
    return {"version": OLLAMA_API_VERSION, "localchat": __version__}


def _listing(model: ServedModel, digest: str = "") -> dict[str, Any]:
    try:
        stat = model.path.stat()
        size, modified = stat.st_size, datetime.fromtimestamp(stat.st_mtime, UTC)
    except OSError:
        size, modified = 0, datetime.fromtimestamp(0, UTC)
    return {"name": model.tag, "model": model.tag,
            "modified_at": modified.isoformat().replace("+00:00", "Z"), "size": size,
            "digest": digest, "details": _details(model)}


def _details(model: ServedModel) -> dict[str, Any]:
    family = model.spec.family or _header(str(model.path)).get("architecture", "")
    params = _header(str(model.path)).get("n_params", 0)
    return {"parent_model": "", "format": "gguf", "family": family,
            "families": [family] if family else None,
            "parameter_size": _params(params) if params else "",
            "quantization_level": model.spec.quant}


@cache
def _header(path: str) -> dict[str, Any]:
    """What /api/show and /api/tags need from a GGUF header (read once per file)."""
    from localchat.models.gguf import read_gguf

    try:
        info = read_gguf(path)
    except Exception:  # a damaged file still gets listed, without these details
        return {}
    return {"architecture": info.architecture or "", "n_params": info.n_params,
            "context_length": info.context_length or 0, "template": info.chat_template or ""}


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def show_body(host: ModelHost, body: dict[str, Any]) -> dict[str, Any]:
    asked = field_of(body, "model", str) or field_of(body, "name", str)
    if not asked:
        raise bad("model", "is missing")
    model = host.resolve(asked)
    header = _header(str(model.path))
    arch = header.get("architecture", "")
    capabilities = (["embedding"] if model.spec.is_embedding else
                    ["completion"] + (["thinking"] if model.spec.thinking != "no" else []))
    info = {"general.architecture": arch, "general.parameter_count": header.get("n_params", 0)}
    if arch:
        info[f"{arch}.context_length"] = header.get("context_length", 0)
    return {"modelfile": "", "parameters": "", "template": header.get("template", ""),
            "details": _details(model), "model_info": info, "capabilities": capabilities,
            "license": model.spec.license, "modified_at": _listing(model)["modified_at"]}


# -- chat --------------------------------------------------------------------------------------

def _line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n"


class ChatShape:
    """One ``/api/chat`` reply (NDJSON lines, or one body) for ``chat``, answered by ``model``
    (``exchange.ReplyShape``)."""

    stream_type = "application/x-ndjson"

    def __init__(self, chat: ChatRequest, model: ServedModel) -> None:
        self._model = model.tag

    def _message_line(self, message: dict[str, Any]) -> bytes:
        return _line({"model": self._model, "created_at": _now(), "message": message,
                      "done": False})

    def opening(self) -> bytes:
        return b""

    def piece(self, piece: Piece) -> bytes:
        message = {"role": "assistant", "content": piece.text if piece.kind == "content" else ""}
        if piece.kind == "thinking":
            message["thinking"] = piece.text
        return self._message_line(message)

    def ending(self, ending: Ending) -> list[bytes]:
        if ending.error is not None:
            return [_line(error_body(ending.error))]
        lines = []
        if ending.tool_calls:  # in a line of their own before the last
            lines.append(_line({"model": self._model, "created_at": _now(), "done": False,
                                "message": {"role": "assistant", "content": "",
                                            "tool_calls": _calls(ending)}}))
        lines.append(_line(self._final(ending, {"role": "assistant", "content": ""})))
        return lines

    def whole(self, ending: Ending) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": ending.content}
        if ending.thinking:
            message["thinking"] = ending.thinking
        if ending.tool_calls:
            message["tool_calls"] = _calls(ending)
        return self._final(ending, message)

    def _final(self, ending: Ending, message: dict[str, Any]) -> dict[str, Any]:
        t = ending.timings
        total_ms = ending.load_ms + t.prompt_ms + t.predicted_ms
        return {"model": self._model, "created_at": _now(), "message": message, "done": True,
                "done_reason": "stop" if ending.finish_reason == "tool_calls" else ending.finish_reason,
                "total_duration": int(total_ms * 1e6),
                "load_duration": int(ending.load_ms * 1e6), "prompt_eval_count": t.prompt_n,
                "prompt_eval_duration": int(t.prompt_ms * 1e6), "eval_count": t.predicted_n,
                "eval_duration": int(t.predicted_ms * 1e6)}


def _calls(ending: Ending) -> list[dict[str, Any]]:
    """The calls in Ollama's shape (arguments as an object; the id too, which newer clients
    read and older ones ignore)."""
    return [{"id": call.id, "function": {"name": call.name, "arguments": call.arguments}}
            for call in ending.tool_calls]
