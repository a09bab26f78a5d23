"""The tools a conversation may use, behind one synchronous facade.

:class:`ToolRegistry` holds the MCP servers of mcp.json and the built-ins turned on in
``[tools]``, and runs everything on one :class:`~localchat.tools.async_thread.AsyncThread`:

- :meth:`~ToolRegistry.start` returns at once; servers come up in the background, so a message
  that calls no tool never waits for them (:meth:`~ToolRegistry.wait_started` is for those that
  want the settled picture, such as ``localchat tools``);
- :meth:`~ToolRegistry.tools` / :meth:`~ToolRegistry.specs` list what can be called now, as
  :class:`~localchat.tools.catalogue.ToolInfo` and as OpenAI function specs (a tool keeps its own
  name unless two servers offer the same one, then both are ``server_tool``);
- :meth:`~ToolRegistry.resolve` looks a :class:`~localchat.reply.calls.ToolCall` up once, as a
  :class:`ResolvedCall`: the tool it names (waiting for servers still starting, where its tool
  may be), or the error result of a call that cannot run or names no tool;
- :meth:`~ToolRegistry.call` runs a resolved call (or resolves one first) and always returns a
  :class:`~localchat.reply.calls.ToolResult`, whatever happens: arguments that do not fit the
  tool's input schema (checked before anything runs), a timeout, Esc (``cancel``), a server that
  crashes, hangs or answers garbage each become an error result for the model with a one-line
  notice for the user. :meth:`~ToolRegistry.submit` is the same as a future, for callers that
  wait their own way.

It knows nothing of the model, the conversation or the screen. Asking the user first is
``tools.approval``'s, done by the caller between :meth:`~ToolRegistry.resolve` and
:meth:`~ToolRegistry.call`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localchat import logs
from localchat.formats.validate import arguments_problem
from localchat.reply.calls import ToolCall, ToolResult, failed_call_result
from localchat.settings import Settings
from localchat.settings.tools import BUILTIN_SERVER, ToolsSettings, secret_env_names
from localchat.tools.async_thread import AsyncThread
from localchat.tools.builtin import builtin_tools, run_builtin
from localchat.tools.catalogue import ServerStatus, ToolInfo
from localchat.tools.config import ServerConfig, load_mcp_config
from localchat.tools.mcp_server import McpServer
from localchat.tools.results import ToolFailure, cancelled_result, error_result, make_result

log = logging.getLogger("localchat.tools")

# The SDK's loggers (and its HTTP client's): their records go to the log file, never the screen.
SDK_LOGGERS = ("mcp", "mcp_types", "client", "httpx2")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")  # what OpenAI's function names allow
CANCEL_POLL_S = 0.05


@dataclass(frozen=True)
class ResolvedCall:
    """A call and the tool it names, looked up once. ``failure`` is the result the model gets
    instead of running anything (a call with a ``problem``, a tool that does not exist); else
    ``tool`` is what runs. ``tool`` is also set for a call that cannot run but names a tool."""

    call: ToolCall
    tool: ToolInfo | None
    failure: ToolResult | None = None

    @property
    def label(self) -> str:
        """``server.tool`` as the user sees the call (its bare name when no tool matches)."""
        return self.tool.label if self.tool else (self.call.name or "a tool call")


class ToolRegistry(contextlib.AbstractContextManager["ToolRegistry"]):
    """MCP servers and built-in tools (see the module). Use as a context manager, or close()."""

    def __init__(self, servers: Sequence[ServerConfig] = (),
                 settings: ToolsSettings | None = None, secrets: frozenset[str] = frozenset(),
                 problems: Sequence[str] = ()) -> None:
        self.settings = settings or ToolsSettings()
        self.secrets = secrets
        self.problems = list(problems)  # mcp.json's, one line each
        self._loop = AsyncThread()
        self._servers = [McpServer(config, secrets, self.settings.start_timeout_s, self._changed)
                         for config in servers]
        self._builtins = builtin_tools(self.settings.builtins)
        self._listeners: list[Callable[[ServerStatus], None]] = []
        self._started = False
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, settings: Settings, mcp_path: Path | None = None) -> ToolRegistry:
        """The registry for the user's mcp.json and ``[tools]`` (not started)."""
        secrets = secret_env_names(settings.remote)
        servers, problems = load_mcp_config(mcp_path, secrets)
        return cls(servers, settings.tools, secrets, problems)

    def __repr__(self) -> str:
        return f"<ToolRegistry {len(self._servers)} servers, {len(self._builtins)} built-ins>"

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- starting and watching ---------------------------------------------------------------

    def start(self) -> None:
        """Start every server in the background; returns at once."""
        with self._lock:
            if self._started:
                return
            self._started = True
        logs.route(*SDK_LOGGERS)  # and localchat's own: a warning never reaches the screen
        if any(not server.config.disabled for server in self._servers):
            self._loop.call_soon(self._start_all)

    def _start_all(self) -> None:
        for server in self._servers:
            if not server.config.disabled:
                server.start()

    def restart(self, name: str) -> None:
        """Start a server again (after it failed or stopped); no effect on a running one."""
        for server in self._servers:
            if server.name == name and server.state in ("failed", "stopped"):
                self._loop.call_soon(server.start)

    def wait_started(self, timeout: float | None = None) -> bool:
        """Wait until no server is starting any more; False if ``timeout`` ran out first."""
        self.start()
        if not self._servers:
            return True
        future = self._loop.submit(self._settled())
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False
        return True

    async def _settled(self) -> None:
        await asyncio.gather(*(server.wait_settled() for server in self._servers))

    def add_listener(self, listener: Callable[[ServerStatus], None]) -> None:
        """``listener(status)`` on every change of a server's state, on the tools' asyncio
        thread (a front end hands it over to its own)."""
        self._listeners.append(listener)

    def _changed(self, server: McpServer) -> None:
        status = server.status()
        if status.state == "failed":
            log.warning("MCP server %s failed: %s", server.name, status.error)
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:  # a front end's bug must not stop the servers
                log.exception("a tool status listener failed")

    # -- what there is -------------------------------------------------------------------------

    def statuses(self) -> list[ServerStatus]:
        """The built-ins first (``disabled`` when none is on), then each server as it is now."""
        tools = tuple(t for t in self.tools() if t.server == BUILTIN_SERVER)
        builtin = ServerStatus(BUILTIN_SERVER, "builtin", "localchat's own tools",
                               "running" if tools else "disabled", tools)
        exposed = {(t.server, t.name): t for t in self.tools()}
        servers = [server.status() for server in self._servers]
        return [builtin, *(replace(s, tools=tuple(exposed.get((t.server, t.name), t)
                                                  for t in s.tools)) for s in servers)]

    def tools(self) -> list[ToolInfo]:
        """The tools that can be called now, each with the name the model sees."""
        found = [*self._builtins, *(tool for server in self._servers for tool in server.tools)]
        counts = collections.Counter(_safe_name(tool.name) for tool in found)
        return [replace(tool, exposed=_safe_name(tool.name) if counts[_safe_name(tool.name)] == 1
                        else _safe_name(f"{tool.server}_{tool.name}")) for tool in found]

    def specs(self) -> list[dict[str, Any]]:
        """:meth:`tools` as OpenAI function specs (for the chat template, or a remote model)."""
        return [tool.spec() for tool in self.tools()]

    def find(self, name: str) -> ToolInfo | None:
        """The tool the model means by ``name``: its exposed name, its own name where only one
        server has it, or ``server.tool``."""
        tools = self.tools()
        for tool in tools:
            if name == tool.exposed:
                return tool
        own = [tool for tool in tools if tool.name == name or tool.label == name]
        return own[0] if len(own) == 1 else None

    def label(self, call: ToolCall) -> str:
        """``server.tool`` for a call, as the user sees it (without waiting for any server)."""
        return self._found(call).label

    def resolve(self, call: ToolCall, wait: float | None = None) -> ResolvedCall:
        """The tool ``call`` names, or the result it gets instead. A runnable call whose tool is
        not there while a server is still starting waits up to ``wait`` seconds
        (``start_timeout_s``) for the servers to settle: its tool may be one of theirs."""
        resolved = self._resolved(call)
        if self._may_appear(resolved):
            self.wait_started(self.settings.start_timeout_s if wait is None else wait)
            resolved = self._resolved(call)
        return resolved

    async def _resolve(self, call: ToolCall, wait: float) -> ResolvedCall:
        """:meth:`resolve` on the tools' thread (the wait counts in a call's own time)."""
        resolved = self._resolved(call)
        if self._may_appear(resolved):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled(), wait)
            resolved = self._resolved(call)
        return resolved

    def _found(self, call: ToolCall) -> ResolvedCall:
        return ResolvedCall(call, self.find(call.name) if call.name else None)

    def _resolved(self, call: ToolCall) -> ResolvedCall:
        found = self._found(call)
        if not call.runnable:
            return replace(found, failure=failed_call_result(call))
        if found.tool is None:
            return replace(found, failure=error_result(call, found.label,
                                                       self._no_such_tool(call.name)))
        return found

    def _may_appear(self, resolved: ResolvedCall) -> bool:
        """Whether the tool a runnable call names may come with a server still starting."""
        return (resolved.call.runnable and resolved.tool is None
                and any(server.state == "starting" for server in self._servers))

    # -- calling -------------------------------------------------------------------------------

    def submit(self, call: ToolCall | ResolvedCall, timeout: float | None = None,
               max_chars: int | None = None) -> concurrent.futures.Future[ToolResult]:
        """Run ``call`` on the tools' thread; the future's ``cancel()`` stops it (the caller
        then hands the model :func:`~localchat.tools.results.cancelled_result`)."""
        self.start()
        return self._loop.submit(self._call(
            call, self.settings.timeout_s if timeout is None else timeout,
            self.settings.result_chars() if max_chars is None else max_chars))

    def call(self, call: ToolCall | ResolvedCall, timeout: float | None = None,
             cancel: threading.Event | None = None, max_chars: int | None = None) -> ToolResult:
        """Run ``call`` (a :class:`ResolvedCall`, or a ToolCall resolved first, the wait for a
        starting server counting in ``timeout``) and wait for its result; setting ``cancel``
        (Esc) stops it within ``CANCEL_POLL_S`` and returns a cancelled result. Not from the
        tools' own thread (a listener): it would wait on itself."""
        if self._loop.in_loop():
            raise RuntimeError("ToolRegistry.call() from the tools' thread would wait on itself")
        future = self.submit(call, timeout, max_chars)
        while True:
            try:
                return future.result(CANCEL_POLL_S if cancel is not None else None)
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.is_set():
                    future.cancel()
                    return self._cancelled(call)
            except concurrent.futures.CancelledError:
                return self._cancelled(call)

    def _cancelled(self, call: ToolCall | ResolvedCall) -> ToolResult:
        if isinstance(call, ResolvedCall):
            return cancelled_result(call.call, call.label)
        return cancelled_result(call, self.label(call))

    async def _call(self, call: ToolCall | ResolvedCall, timeout: float,
                    max_chars: int) -> ToolResult:
        deadline = asyncio.get_running_loop().time() + timeout
        resolved = call if isinstance(call, ResolvedCall) else await self._resolve(call, timeout)
        if resolved.failure is not None:
            return resolved.failure
        call, tool = resolved.call, resolved.tool
        assert tool is not None  # a call resolved without a failure names its tool
        problem = arguments_problem(tool.input_schema, call.arguments)
        if problem:
            return error_result(call, tool.label, f"the arguments do not fit the input schema "
                                                  f"of {tool.exposed}: {problem}")
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            text, is_error = await asyncio.wait_for(self._invoke(tool, call.arguments), remaining)
        except TimeoutError:
            return error_result(call, tool.label,
                                f"no answer within {timeout:g} s; the call was stopped")
        except ToolFailure as exc:
            return error_result(call, tool.label, str(exc))
        except Exception as exc:  # a bug of ours or an SDK surprise: the log has the traceback
            log.exception("tool call %s failed", tool.label)
            return error_result(call, tool.label, f"the call failed unexpectedly "
                                                  f"({type(exc).__name__}: {exc})")
        return make_result(call, tool.label, text, is_error, max_chars)

    async def _invoke(self, tool: ToolInfo, arguments: dict[str, Any]) -> tuple[str, bool]:
        if tool.server == BUILTIN_SERVER:
            return await run_builtin(tool.name, arguments, self.secrets)
        for server in self._servers:
            if server.name == tool.server:
                return await server.call(tool.name, arguments)
        raise ToolFailure(f"the server {tool.server} is gone")

    def _no_such_tool(self, name: str) -> str:
        names = [tool.exposed for tool in self.tools()]
        if not names:
            return f"there is no tool named {name} (no tools are available)"
        return f"there is no tool named {name} (the tools are: {', '.join(names)})"

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every server (their children end) and the tools' thread."""
        self._loop.close(self._stop_all() if self._started else None)

    async def _stop_all(self) -> None:
        await asyncio.gather(*(server.stop() for server in self._servers))


def _safe_name(name: str) -> str:
    return _UNSAFE_NAME.sub("_", name)[:64] or "tool"
