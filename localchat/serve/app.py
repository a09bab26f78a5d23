"""``localchat serve``'s server: the safety gate every request passes first, then its route
(``routes``: both APIs over the one ``exchange``), and the asyncio loop that listens until
Ctrl+C or SIGTERM (``listener``: connections within the file limit). An error raised while
answering is caught here once and answered in the shape of the API the path belongs to; answers
to an allowed browser origin carry its CORS headers.

Shutting down (``stop``, from a signal): no new connections; waiting requests end with a 503;
the running one is stopped within a token and its stream ends with an error event saying the
server is shutting down. Whoever made the model host closes it afterwards (``localchat serve``
does). Nothing is written to disk: the saved conversation states live in RAM only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localchat.serve import routes
from localchat.serve.exchange import Exchange
from localchat.serve.http import Connection, Limits, Request, serve_connection
from localchat.serve.http_errors import ApiError, Unreadable
from localchat.serve.listener import Listener, bind, say_on_stderr
from localchat.serve.model_host import ModelHost
from localchat.serve.respond import Responder, json_bytes
from localchat.serve.safety import Gate
from localchat.serve.scheduler import Scheduler
from localchat.settings import ServeSection


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


class ServeApp:
    """The server: a gate, the routes, the exchange over the model host."""

    def __init__(self, host: ModelHost, options: ServeOptions) -> None:
        self.host = host
        self.options = options
        self.gate = Gate(options.host, options.api_key, options.cors_origins)
        self.exchange = Exchange(host, options.max_queue)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._connections: dict[asyncio.Task, Connection] = {}
        self._listener: Listener | None = None
        self._starting: set[asyncio.Task] = set()
        self.port = options.port
        self.notice: Callable[[str], None] = say_on_stderr  # one line about the server's state

    @property
    def scheduler(self) -> Scheduler:
        return self.exchange.scheduler

    # -- one request ----------------------------------------------------------------------------

    async def handle(self, request: Request, connection: Connection) -> None:
        out = Responder(request, connection, self.gate.cors_headers(request))
        try:
            await self._route(out)
        except ApiError as error:
            if connection.responded:  # a stream had begun: all that is left is to close it
                connection.keep_alive = False
                return
            await out.send_json(error.status, routes.error_body(error, request.path), error.headers)

    async def _route(self, out: Responder) -> None:
        request = out.request
        refusal = self.gate.refuse(request)
        if refusal is not None:
            raise refusal
        if request.method == "OPTIONS":
            await out.connection.send(204, b"", "text/plain", self.gate.preflight_headers(request))
            return
        await routes.route_for(request)(self.exchange, out)

    async def _unreadable(self, connection: Connection, error: Unreadable) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await connection.send(error.status, json_bytes(routes.error_body(error)))

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, on_ready: Callable[[ServeApp], None] | None = None) -> None:
        """Listen until ``stop``; then shut down as the module docstring says."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        listener = Listener(bind(self.options.host, self.options.port), self._admit,
                            self._connections.values, self.notice)
        self._listener = listener
        self.port = listener.sockets[0].getsockname()[1]
        listener.start()
        if on_ready is not None:
            on_ready(self)
        try:
            await self._stopping.wait()
        finally:
            await listener.close()
            for connection in list(self._connections.values()):
                if not connection.busy:  # idle keep-alive connections: nothing to finish
                    connection.hang_up()
            self.exchange.close()
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

    def _admit(self, client: socket.socket) -> None:
        """(The listener.) Serve a connection just accepted, on a task of its own."""
        assert self._loop is not None
        task = self._loop.create_task(self._serve(client))
        self._starting.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._starting.discard)

    async def _serve(self, client: socket.socket) -> None:
        task = asyncio.current_task()
        assert task is not None and self._listener is not None
        try:
            reader, writer = await asyncio.open_connection(sock=client)
        except OSError:  # the client has gone already
            client.close()
            self._listener.left()
            return
        connection = Connection(reader, writer, self.options.limits)
        self._connections[task] = connection
        try:
            await serve_connection(connection, self.handle, self._unreadable)
        except asyncio.CancelledError:
            pass  # shutting down
        finally:
            self._connections.pop(task, None)
            self._listener.left()

    @property
    def base_url(self) -> str:
        host = self.options.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"

