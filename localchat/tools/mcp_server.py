"""One MCP server: started in the background, its state and tools, and calls to it.

:class:`McpServer` lives on the tools' asyncio thread (``tools.async_thread``). Its
:meth:`~McpServer.run` task opens the transport (a child process over stdio, or streamable HTTP /
SSE), initializes the session, lists the tools and then holds the session open until the server
is closed or its connection ends, because the SDK's transports must be opened and closed by one
task. Its state is ``starting``, ``running`` (with its tools), ``failed`` (with the reason: the
last line its program wrote to stderr, a timeout, a refused connection), ``disabled`` (in
mcp.json, not started) or ``stopped``; :meth:`~McpServer.status` is it as a
``tools.catalogue.ServerStatus``.

A child gets an allow-listed environment without localchat's secrets (``tools.environment``); its
stderr goes line by line to the log file, never to the screen, and the last lines are kept to say
why it failed. Lines it writes to stdout that are not MCP messages are skipped (and counted). A
server that exits during a call fails that call with its last stderr line and is marked failed;
the other servers go on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any, TextIO, cast

from localchat import __version__, logs
from localchat.tools.catalogue import ServerStatus, State, ToolInfo
from localchat.tools.config import ServerConfig
from localchat.tools.environment import child_environment
from localchat.tools.results import ToolFailure, mcp_text, one_line

MAX_EVENT_BYTES = 64 * 1024 * 1024  # one streamed HTTP message; larger ones end the connection
STDERR_LINES = 20
STDERR_LINE_CHARS = 8192  # a longer line is cut (the rest of it is counted, not kept)
SERVER_NICENESS = 10  # a stdio server's CPU priority below localchat's (see lowered_priority)
STOP_S = 5.0  # closing a server: the SDK's own shutdown takes up to 4 s (stdin close, TERM, KILL)


class StderrTail:
    """Reads a child's stderr on a thread: each line to the log, the last few kept."""

    def __init__(self, server: str) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._log = logs.server_log(server)
        read, write = os.pipe()
        self.writer: TextIO | None = cast(TextIO, os.fdopen(write, "w"))
        self._thread = threading.Thread(target=self._read, args=(read,), daemon=True,
                                        name=f"mcp-stderr-{server}")
        self._thread.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, encoding="utf-8", errors="replace") as stream:
            while line := stream.readline(STDERR_LINE_CHARS):
                if not line.endswith("\n") and len(line) == STDERR_LINE_CHARS:
                    # A line without end (a server dumping a blob): keep its start, skip the rest,
                    # so that neither this thread's memory nor the log grows with it.
                    skipped = 0
                    while (rest := stream.readline(STDERR_LINE_CHARS)) and not rest.endswith("\n"):
                        skipped += len(rest)
                    skipped += len(rest)
                    line = f"{line} [… {skipped:,} more characters]"
                line = line.rstrip("\n")
                if line.strip():
                    self._lines.append(line)
                    self._log.info("%s", line)

    def spawned(self) -> None:
        """The child has its copy of the pipe: drop ours, so that its exit ends the reading."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def last_line(self, wait: float = 0.5) -> str:
        """The last line written, once the pipe has ended or ``wait`` has passed (a child that
        just exited may still have its last words in the pipe); never blocks the loop."""
        deadline = asyncio.get_running_loop().time() + wait
        while self._thread.is_alive() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return self._lines[-1] if self._lines else ""


class McpServer:
    """One configured server (see the module)."""

    def __init__(self, config: ServerConfig, secrets: frozenset[str], start_timeout: float,
                 on_change: Callable[[McpServer], None] = lambda server: None) -> None:
        self.config = config
        self._secrets = secrets
        self._start_timeout = start_timeout
        self._on_change = on_change
        self._state: State = "disabled" if config.disabled else "starting"
        self._error = ""
        self._tools: tuple[ToolInfo, ...] = ()
        self._session: Any = None
        self._stderr: StderrTail | None = None
        self._closing: asyncio.Event | None = None
        self._lost: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._garbage = 0  # stdout lines that were not MCP messages
        self._log = logging.getLogger(f"localchat.tools.{config.name}")

    def __repr__(self) -> str:
        return f"<McpServer {self.config.name} {self._state}>"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def state(self) -> State:
        return self._state

    @property
    def tools(self) -> tuple[ToolInfo, ...]:
        return self._tools if self._state == "running" else ()

    def status(self) -> ServerStatus:
        return ServerStatus(self.name, self.config.transport, self.config.describe(), self._state,
                            self.tools, self._error)

    def _set(self, state: State, error: str = "") -> None:
        self._state, self._error = state, one_line(error, 300) if error else ""
        self._on_change(self)

    def start(self) -> asyncio.Task[None]:
        """Start :meth:`run` as a task of the running loop (call it on the loop)."""
        if not self.config.disabled:
            self._set("starting")
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"mcp-{self.name}")
        return self._task

    async def run(self) -> None:
        """Connect, list the tools, and hold the session until :meth:`stop` or a lost connection."""
        if self.config.disabled:
            return
        self._closing, self._lost = asyncio.Event(), asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._open(stack)
                session = await self._open_session(stack, read, write)
                import anyio

                with anyio.fail_after(self._start_timeout):
                    await session.initialize()
                    tools = await self._list_tools(session)
                self._session, self._tools = session, tools
                self._set("running")
                await self._until_closed_or_lost()
                self._session = None
                if not self._closing.is_set():
                    self._set("failed", await self._exit_reason())
        except asyncio.CancelledError:
            self._session = None
            if self._state in ("starting", "running"):
                self._set("stopped")
            raise
        except Exception as exc:  # whatever a transport raises: the reason, in one line
            leaf = _leaf(exc)
            if isinstance(leaf, TimeoutError):
                await self._fail(f"did not answer within {self._start_timeout:g} s")
            elif _connection_closed(leaf) and self.config.transport == "stdio":
                await self._fail("the server exited while starting")
            else:
                await self._fail(_describe(exc))
        if self._closing.is_set() and self._state in ("starting", "running"):
            self._set("stopped")

    async def _fail(self, reason: str) -> None:
        self._session = None
        last = await self._stderr.last_line() if self._stderr else ""
        self._set("failed", f"{reason}: {last}" if last and last not in reason else reason)

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        config = self.config
        if config.transport == "stdio":
            from mcp import StdioServerParameters, stdio_client

            command, args = lowered_priority(config.command, list(config.args))
            params = StdioServerParameters(
                command=command, args=args, cwd=config.cwd,
                env=child_environment(config.env, self._secrets), encoding_error_handler="replace")
            self._stderr = tail = StderrTail(config.name)
            assert tail.writer is not None
            stack.callback(tail.spawned)  # also when the spawn fails
            streams = await stack.enter_async_context(stdio_client(params, errlog=tail.writer))
            tail.spawned()
            return streams
        headers = dict(config.headers) or None
        if config.transport == "sse":
            from mcp.client.sse import sse_client

            return await stack.enter_async_context(sse_client(config.url, headers=headers))
        import httpx2  # the MCP SDK's HTTP client: headers go through one of our own
        from mcp.client.streamable_http import streamable_http_client

        # The SDK's own defaults: 30 s to connect or send, 5 min for a response stream.
        client = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)))
        return await stack.enter_async_context(streamable_http_client(
            config.url, http_client=client, max_sse_event_size=MAX_EVENT_BYTES))

    async def _open_session(self, stack: contextlib.AsyncExitStack, read: Any, write: Any) -> Any:
        """The session, reading through a pump that skips garbage lines and notices the end."""
        import anyio
        from mcp import ClientSession, Implementation

        sink, source = anyio.create_memory_object_stream[Any](0)
        group = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(group.cancel_scope.cancel)  # runs before the group is awaited on exit
        group.start_soon(self._pump, read, sink)
        return await stack.enter_async_context(ClientSession(
            source, write, client_info=Implementation(name="localchat", version=__version__)))

    async def _pump(self, read: Any, sink: Any) -> None:
        import anyio

        try:
            async with sink:
                async for item in read:
                    if isinstance(item, Exception):  # a stdout line that is not an MCP message
                        self._garbage += 1
                        if self._garbage == 1:
                            self._log.warning("%s wrote to stdout what is not an MCP message "
                                              "(skipped): %s", self.name, item)
                        continue
                    await sink.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass
        finally:
            if self._lost is not None:
                self._lost.set()

    async def _list_tools(self, session: Any) -> tuple[ToolInfo, ...]:
        from mcp.types import PaginatedRequestParams

        tools: list[ToolInfo] = []
        cursor = None
        while True:
            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(ToolInfo(self.name, tool.name, tool.description or "",
                                  dict(tool.input_schema or {})) for tool in page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tuple(tools)

    async def _until_closed_or_lost(self) -> None:
        assert self._closing is not None and self._lost is not None
        waits = {asyncio.ensure_future(self._closing.wait()), asyncio.ensure_future(self._lost.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _exit_reason(self) -> str:
        if self.config.transport != "stdio":
            return "the connection to the server was closed"
        last = await self._stderr.last_line() if self._stderr else ""
        return f"the server exited: {last}" if last else "the server exited (nothing on stderr)"

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(text, is_error) of one call; ToolFailure when it could not be made or finish."""
        from mcp import MCPError

        session = self._session
        if session is None or self._state != "running":
            raise ToolFailure(self._not_running())
        try:
            result = await session.call_tool(tool, arguments)
        except MCPError as exc:
            if not _connection_closed(exc):
                raise ToolFailure(f"{self.name} refused the call: {exc.message}") from None
            if self._lost is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._lost.wait(), 1.0)
            raise ToolFailure(f"{await self._exit_reason()} (during the call)") from None
        except Exception as exc:  # an answer that does not fit MCP's shapes
            raise ToolFailure(f"{self.name}'s answer could not be read: {_describe(exc)}") from None
        return mcp_text(result.content, result.structured_content), bool(result.is_error)

    def _not_running(self) -> str:
        if self._state == "failed":
            return f"the server {self.name} is not running ({self._error})"
        return f"the server {self.name} is {self._state}"

    async def wait_settled(self) -> None:
        """Until the server is past starting (running, failed, disabled or stopped)."""
        while self._state == "starting":
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Close the session and end the child (the SDK's shutdown: stdin, TERM, KILL)."""
        task = self._task
        if task is None or task.done():
            return
        if self._closing is not None:
            self._closing.set()
        if self._state == "starting":
            task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_S)
        except (TimeoutError, asyncio.CancelledError, Exception):
            task.cancel()


def lowered_priority(command: str, args: list[str]) -> tuple[str, list[str]]:
    """The command run under ``nice`` (POSIX, where there is one): a server starting up (an
    interpreter importing its SDK, often seconds of CPU) yields the cores to the model, so a
    message sent meanwhile is not slowed; a call is not either, since the model waits for it."""
    nice = shutil.which("nice") if os.name == "posix" else None
    if nice is None:
        return command, args
    return nice, ["-n", str(SERVER_NICENESS), command, *args]


def _connection_closed(exc: BaseException) -> bool:
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """One line for an exception (the first real one inside anyio's exception groups)."""
    exc = _leaf(exc)
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {exc.filename or 'the program'}: not found"
    if isinstance(exc, PermissionError):
        return f"cannot start {exc.filename or 'the program'}: permission denied"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip() or type(exc).__name__
    name = type(exc).__name__
    return text if name in text or type(exc).__module__.startswith("mcp") else f"{name}: {text}"
