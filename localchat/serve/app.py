"""``localchat serve``'s server: the routes, the safety gate before them, and the asyncio loop that
listens until Ctrl+C or SIGTERM.

Routes: ``GET /``, ``GET /health`` (llama-server's), the OpenAI API (``GET /v1/models``, ``POST
/v1/chat/completions``, also without ``/v1``) and the Ollama API (``GET /api/tags``, ``GET
/api/version``, ``POST /api/show``, ``POST /api/chat``). Errors take the shape of the API the path
belongs to (Ollama's under ``/api/``, OpenAI's elsewhere). Every request passes the gate
(``safety``) first; answers to an allowed browser origin carry its CORS headers.

Shutting down (``stop``, from a signal): no new connections; waiting requests end with a 503;
the running one is stopped within a token and its stream ends with an error event saying the
server is shutting down. Whoever made the model host closes it afterwards (``localchat serve``
does). Nothing is written to disk: the saved conversation states live in RAM only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localchat.serve import ollama_api, openai_api
from localchat.serve.http import Connection, HttpError, Limits, Request, serve_connection
from localchat.serve.models import ModelHost
from localchat.serve.reply import Ending
from localchat.serve.request import ApiError, json_object
from localchat.serve.safety import Gate
from localchat.serve.scheduler import Job, Scheduler
from localchat.serve.tool_fields import RawCalls
from localchat.settings import ServeSection

Route = Callable[["ServeApp", Request, Connection], Awaitable[None]]


@dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    api_key: str | None
    cors_origins: list[str]
    max_queue: int
    limits: Limits

    @classmethod
    def from_settings(cls, section: ServeSection, **flags: Any) -> ServeOptions:
        """``[serve]`` with the flags that were given (None: not given) on top."""
        given = {k: v for k, v in flags.items() if v is not None}
        return cls(
            host=given.get("host", section.host), port=given.get("port", section.port),
            api_key=given.get("api_key") or None,
            cors_origins=list(given.get("cors_origins") or section.cors_origins),
            max_queue=given.get("max_queue", section.max_queue),
            limits=Limits(section.max_body_bytes, section.request_timeout_s, section.idle_timeout_s))


async def _root(app: ServeApp, request: Request, connection: Connection) -> None:
    await app.send(request, connection, 200, b"localchat is running", "text/plain; charset=utf-8")


async def _health(app: ServeApp, request: Request, connection: Connection) -> None:
    await app.send_json(request, connection, 200, {"status": "ok"})


async def _models(app: ServeApp, request: Request, connection: Connection) -> None:
    await app.send_json(request, connection, 200, openai_api.models_body(app))


async def _tags(app: ServeApp, request: Request, connection: Connection) -> None:
    await app.send_json(request, connection, 200, ollama_api.tags_body(app))


async def _version(app: ServeApp, request: Request, connection: Connection) -> None:
    await app.send_json(request, connection, 200, ollama_api.version_body())


async def _show(app: ServeApp, request: Request, connection: Connection) -> None:
    body = ollama_api.show_body(app, json_object(request.body))
    await app.send_json(request, connection, 200, body)


ROUTES: dict[str, dict[str, Route]] = {
    "/": {"GET": _root, "HEAD": _root},
    "/health": {"GET": _health}, "/v1/health": {"GET": _health},
    "/v1/models": {"GET": _models}, "/models": {"GET": _models},
    "/v1/chat/completions": {"POST": openai_api.chat_completions},
    "/chat/completions": {"POST": openai_api.chat_completions},
    "/api/tags": {"GET": _tags}, "/api/version": {"GET": _version},
    "/api/show": {"POST": _show}, "/api/chat": {"POST": ollama_api.chat},
}


class ServeApp:
    """The server: a gate, the routes, the scheduler over the model host."""

    def __init__(self, host: ModelHost, options: ServeOptions) -> None:
        self.host = host
        self.options = options
        self.gate = Gate(options.host, options.api_key, options.cors_origins)
        self.scheduler = Scheduler(host, options.max_queue)
        self.raw_calls = RawCalls()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._connections: dict[asyncio.Task, Connection] = {}
        self.port = options.port

    # -- helpers for the API modules ------------------------------------------------------------

    def start_job(self, chat: Any, connection: Connection) -> Job:
        """Queue ``chat`` for the model it names (ApiError 404/503), and watch for its client
        leaving while it waits or streams."""
        assert self._loop is not None
        chat.messages = self.raw_calls.restore(chat.messages)
        job = Job(chat, self.host.resolve(chat.model), self._loop)
        self.scheduler.submit(job)
        connection.watch()
        return job

    def remember_calls(self, ending: Ending) -> None:
        """A reply that called tools, kept so that the client's next request renders it as the
        model wrote it (``tool_fields.RawCalls``)."""
        if ending.error is None:
            self.raw_calls.remember(ending.content, ending.tool_calls, ending.reply)

    async def send(self, request: Request, connection: Connection, status: int, body: bytes,
                   content_type: str, headers: dict[str, str] | None = None) -> None:
        await connection.send(status, b"" if request.method == "HEAD" else body, content_type,
                              {**self.gate.cors_headers(request), **(headers or {})})

    async def send_json(self, request: Request, connection: Connection, status: int,
                        body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        await self.send(request, connection, status, json.dumps(body, ensure_ascii=False).encode(),
                        "application/json", headers)

    async def start_stream(self, request: Request, connection: Connection, content_type: str) -> None:
        await connection.start_stream(200, content_type, self.gate.cors_headers(request))

    # -- one request ----------------------------------------------------------------------------

    async def handle(self, request: Request, connection: Connection) -> None:
        try:
            await self._route(request, connection)
        except ApiError as error:
            if connection.responded:  # a stream had begun: all that is left is to close it
                connection.keep_alive = False
                return
            await self.send_error(request, connection, error)

    async def _route(self, request: Request, connection: Connection) -> None:
        refusal = self.gate.refuse(request)
        if refusal is not None:
            raise ApiError(refusal.status, refusal.message, code=refusal.code,
                           kind="authentication_error" if refusal.status == 401 else "forbidden",
                           headers=refusal.headers)
        methods = ROUTES.get(request.path)
        if request.method == "OPTIONS":
            await connection.send(204, b"", "text/plain", self.gate.preflight_headers(request))
            return
        if methods is None:
            raise ApiError(404, f"no such route: {request.method} {request.path}", code="not_found")
        route = methods.get(request.method)
        if route is None:
            raise ApiError(405, f"{request.path} takes {', '.join(methods)}, not {request.method}",
                           code="method_not_allowed", headers={"Allow": ", ".join(methods)})
        await route(self, request, connection)

    async def send_error(self, request: Request, connection: Connection, error: ApiError) -> None:
        body = (ollama_api.error_body(error) if request.path.startswith("/api/")
                else openai_api.error_body(error))
        await self.send_json(request, connection, error.status, body, error.headers)

    async def _unreadable(self, connection: Connection, error: HttpError) -> None:
        body = json.dumps({"error": {"message": error.message, "type": "invalid_request_error",
                                     "param": None, "code": None}}).encode()
        with contextlib.suppress(ConnectionError, OSError):
            await connection.send(error.status, body)

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, on_ready: Callable[[ServeApp], None] | None = None) -> None:
        """Listen until ``stop``; then shut down as the module docstring says."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.options.host, self.options.port)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready(self)
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for connection in list(self._connections.values()):
                if not connection.busy:  # idle keep-alive connections: nothing to finish
                    connection.hang_up()
            await self._loop.run_in_executor(None, self.scheduler.close)
            if self._connections:  # the streams write their last events
                await asyncio.wait(list(self._connections), timeout=5)
            for task in list(self._connections):
                task.cancel()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[ServeApp]:
        """Listen on a thread of this process until the block ends (benches, tests); the port is
        known (``base_url``) when the block starts."""
        ready = threading.Event()
        thread = threading.Thread(target=lambda: asyncio.run(self.run(lambda _: ready.set())),
                                  name="localchat-serve", daemon=True)
        thread.start()
        if not ready.wait(30):
            raise RuntimeError("the server did not start")
        try:
            yield self
        finally:
            self.stop()
            thread.join(30)

    def stop(self) -> None:
        """Begin shutting down (from any thread or a signal handler)."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = Connection(reader, writer, self.options.limits)
        self._connections[task] = connection
        try:
            await serve_connection(connection, self.handle, self._unreadable)
        except asyncio.CancelledError:
            pass  # shutting down: asyncio's stream callback would log a cancelled handler
        finally:
            self._connections.pop(task, None)

    @property
    def base_url(self) -> str:
        host = self.options.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"

