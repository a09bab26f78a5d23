"""Embeddings: an :class:`embed_request.EmbedRequest` run in its turn in the request queue (a
``task.Task``) and answered in the shape of the API that asked.

- OpenAI ``/v1/embeddings``: ``{"object": "list", "data": [{"object": "embedding", "index",
  "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``; each embedding a list
  of floats, or with ``encoding_format: "base64"`` its little-endian float32 bytes in base64 (what
  the ``openai`` SDK asks for by default, and decodes).
- Ollama ``/api/embed``: ``{"model", "embeddings": [[...]], "total_duration", "load_duration",
  "prompt_eval_count"}`` (durations in ns); ``/api/embeddings``: ``{"embedding": [...]}``.

Vectors are L2-normalised, in the order of the inputs. Where they come from (an embedding model
beside the chat model, or the chat model mean-pooled) is the host's (``model_host.embedder``);
what needs the model is checked here, on the queue's thread: token ids within its vocabulary, each
input within its context (cut to it when the request truncates, else a 400), and at most
``MAX_TOKENS`` tokens in all.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from localchat.serve.embed_request import MAX_TOKENS, EmbedRequest
from localchat.serve.http_errors import bad
from localchat.serve.model_host import ModelHost, ServedModel
from localchat.serve.scheduler import Scheduler
from localchat.serve.task import Task


@dataclass(frozen=True)
class Embedded:
    """The vectors of one request, with what Ollama and OpenAI report about them."""

    model: ServedModel
    vectors: np.ndarray  # (inputs, dimensions) float32, rows of length 1
    n_tokens: int  # tokens evaluated, all inputs together
    load_ms: float
    total_ms: float


async def embed(scheduler: Scheduler, host: ModelHost, request: EmbedRequest) -> Embedded:
    """Run ``request`` in its turn (Busy, ShuttingDown, NotFound, BadRequest as they arise)."""
    model = host.resolve(request.model)
    task = Task(lambda host: _run(host, model, request))
    scheduler.submit(task)
    result: Embedded = await task.result()
    return result


def _run(host: ModelHost, model: ServedModel, request: EmbedRequest) -> Embedded:
    """(A job thread of the scheduler.)"""
    started = time.perf_counter()
    embedder, load_ms = host.embedder(model)
    if request.dimensions is not None and request.dimensions != embedder.n_embd:
        raise bad("dimensions", f"must be {embedder.n_embd} for {model.name} (its vectors are not "
                                f"cut to other sizes), not {request.dimensions}")
    texts = [item for item in request.inputs if isinstance(item, str)]
    tokenized = iter(embedder.tokenize(texts) if texts else [])
    inputs = [next(tokenized) if isinstance(item, str) else item for item in request.inputs]
    for i, tokens in enumerate(inputs):
        _check_tokens(tokens, i, request, embedder.n_vocab)
        if len(tokens) > embedder.n_ctx:
            if not request.truncate:
                raise bad(_where(request, i), f"is {len(tokens):,} tokens; {model.name} embeds at "
                          f"most {embedder.n_ctx:,} a text: send shorter parts")
            inputs[i] = tokens[:embedder.n_ctx]
    total = sum(len(tokens) for tokens in inputs)
    if total > MAX_TOKENS:
        raise bad(_where(request), f"is {total:,} tokens; at most {MAX_TOKENS:,} go in one request")
    vectors = embedder.embed(inputs)
    return Embedded(model, vectors, total, load_ms, (time.perf_counter() - started) * 1000.0)


def _check_tokens(tokens: list[int], i: int, request: EmbedRequest, n_vocab: int) -> None:
    if not tokens:
        raise bad(_where(request, i), "holds no tokens once tokenized")
    if isinstance(request.inputs[i], str):
        return
    for j, token in enumerate(tokens):
        if token >= n_vocab:
            raise bad(f"{_where(request, i)}[{j}]", f"is token id {token}; the model's vocabulary "
                                                    f"holds ids 0 to {n_vocab - 1}")


def _where(request: EmbedRequest, i: int | None = None) -> str:
    """The field an input came from, as the client wrote it (``input[3]``, ``input``)."""
    if i is None or not request.listed:
        return request.field
    return f"{request.field}[{i}]"


# -- answers -----------------------------------------------------------------------------------

def openai_body(result: Embedded, request: EmbedRequest) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i,
             "embedding": _base64(vector) if request.base64 else vector.tolist()}
            for i, vector in enumerate(result.vectors)]
    return {"object": "list", "data": data, "model": result.model.name,
            "usage": {"prompt_tokens": result.n_tokens, "total_tokens": result.n_tokens}}


def _base64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def ollama_body(result: Embedded) -> dict[str, Any]:
    return {"model": result.model.tag, "embeddings": result.vectors.tolist(),
            "total_duration": int(result.total_ms * 1e6),
            "load_duration": int(result.load_ms * 1e6), "prompt_eval_count": result.n_tokens}


def ollama_legacy_body(result: Embedded) -> dict[str, Any]:
    return {"embedding": result.vectors[0].tolist()}
