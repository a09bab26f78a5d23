"""What each path answers: ``GET /``, ``GET /health`` (llama-server's), the OpenAI API (``GET
/v1/models``, ``POST /v1/chat/completions``, also without ``/v1``) and the Ollama API (``GET
/api/tags``, ``GET /api/ps``, ``GET /api/version``, ``POST /api/show``, ``POST /api/chat``);
completions, a prompt continued as it is (OpenAI's ``POST /v1/completions``, llama-server's
``POST /infill``, Ollama's ``POST /api/generate``); and embeddings (``POST /v1/embeddings``,
Ollama's ``POST /api/embed`` and ``/api/embeddings``). The chats run through the one ``exchange``,
each in its API's shape; errors take the shape of the API the path belongs to (:func:`error_body`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from localchat.serve import (
    embed_request,
    embeddings,
    infill_api,
    ollama_api,
    ollama_generate,
    openai_api,
    openai_completions,
)
from localchat.serve.exchange import Exchange, ParseChat, ShapeFor
from localchat.serve.fields import json_object
from localchat.serve.http import Request
from localchat.serve.http_errors import MethodNotAllowed, NotFound, ServeError
from localchat.serve.respond import Responder

Route = Callable[[Exchange, Responder], Awaitable[None]]


async def _root(exchange: Exchange, out: Responder) -> None:
    await out.send(200, b"localchat is running", "text/plain; charset=utf-8")


async def _health(exchange: Exchange, out: Responder) -> None:
    await out.send_json(200, {"status": "ok"})


async def _models(exchange: Exchange, out: Responder) -> None:
    await out.send_json(200, openai_api.models_body(exchange.host.listed()))


async def _tags(exchange: Exchange, out: Responder) -> None:
    models = exchange.host.listed()  # a file's first digest takes seconds: off the loop
    await out.send_json(200, await asyncio.to_thread(ollama_api.tags_body, models))


async def _ps(exchange: Exchange, out: Responder) -> None:
    await out.send_json(200, await asyncio.to_thread(ollama_api.ps_body, exchange.host))


async def _version(exchange: Exchange, out: Responder) -> None:
    await out.send_json(200, ollama_api.version_body())


async def _show(exchange: Exchange, out: Responder) -> None:
    await out.send_json(200, ollama_api.show_body(exchange.host, json_object(out.request.body)))


async def _chat_completions(exchange: Exchange, out: Responder) -> None:
    chat = await exchange.read(openai_api.parse_chat, out.request.body)
    await exchange.answer(chat, openai_api.ChatShape, out)


async def _ollama_chat(exchange: Exchange, out: Responder) -> None:
    chat = await exchange.read(ollama_api.parse_chat, out.request.body)
    await exchange.answer(chat, ollama_api.ChatShape, out)


def _answering(parse: ParseChat, shape: ShapeFor) -> Route:
    """The route that reads its body with ``parse`` and answers in the shape ``shape`` makes."""
    async def route(exchange: Exchange, out: Responder) -> None:
        await exchange.answer(await exchange.read(parse, out.request.body), shape, out)

    return route


async def _generate(exchange: Exchange, out: Responder) -> None:
    request = await exchange.read(ollama_generate.parse_generate, out.request.body)
    if ollama_generate.only_loads(request):
        await out.send_json(200, ollama_generate.load_body(exchange.host.resolve(request.model)))
        return
    await exchange.answer(request, ollama_generate.GenerateShape, out)


async def _embeddings(exchange: Exchange, out: Responder) -> None:
    request = await exchange.read(embed_request.parse_openai, out.request.body)
    result = await embeddings.embed(exchange.scheduler, exchange.host, request)
    await out.send_json(200, embeddings.openai_body(result, request))


async def _ollama_embed(exchange: Exchange, out: Responder) -> None:
    request = await exchange.read(embed_request.parse_ollama, out.request.body)
    result = await embeddings.embed(exchange.scheduler, exchange.host, request)
    await out.send_json(200, embeddings.ollama_body(result))


async def _ollama_embeddings(exchange: Exchange, out: Responder) -> None:
    request = await exchange.read(embed_request.parse_ollama_legacy, out.request.body)
    result = await embeddings.embed(exchange.scheduler, exchange.host, request)
    await out.send_json(200, embeddings.ollama_legacy_body(result))


ROUTES: dict[str, dict[str, Route]] = {
    "/": {"GET": _root, "HEAD": _root},
    "/health": {"GET": _health}, "/v1/health": {"GET": _health},
    "/v1/models": {"GET": _models}, "/models": {"GET": _models},
    "/v1/chat/completions": {"POST": _chat_completions},
    "/chat/completions": {"POST": _chat_completions},
    "/api/tags": {"GET": _tags}, "/api/version": {"GET": _version},
    "/api/ps": {"GET": _ps},
    "/api/show": {"POST": _show}, "/api/chat": {"POST": _ollama_chat},
    "/v1/embeddings": {"POST": _embeddings}, "/embeddings": {"POST": _embeddings},
    "/api/embed": {"POST": _ollama_embed}, "/api/embeddings": {"POST": _ollama_embeddings},
}

# Completions: a prompt continued as it is, no chat template (``prompt_tokens``).
_completions = _answering(openai_completions.parse_completion, openai_completions.CompletionShape)
ROUTES.update({
    "/v1/completions": {"POST": _completions}, "/completions": {"POST": _completions},
    "/infill": {"POST": _answering(infill_api.parse_infill, infill_api.InfillShape)},
    "/api/generate": {"POST": _generate},
})


def route_for(request: Request) -> Route:
    """What answers ``request``: NotFound (404) for no such path, MethodNotAllowed (405)."""
    methods = ROUTES.get(request.path)
    if methods is None:
        raise NotFound(f"no such route: {request.method} {request.path}", code="not_found")
    route = methods.get(request.method)
    if route is None:
        raise MethodNotAllowed(request.path, request.method, list(methods))
    return route


def error_body(error: ServeError, path: str = "") -> dict[str, Any]:
    """``error`` in the shape of the API ``path`` belongs to: Ollama's under ``/api/``, OpenAI's
    elsewhere (and for a request that could not be read, which has no path)."""
    if path.startswith("/api/"):
        return ollama_api.error_body(error)
    return openai_api.error_body(error)
