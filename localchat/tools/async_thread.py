"""One asyncio loop on a thread of its own, owning every MCP session and every running call.

The MCP SDK is async (anyio) and a session's transport must be opened and closed by the same task,
while the rest of localchat is threads (the engine's, the TUI's workers, ``ask``). So the tool
registry runs everything on this loop and hands out ``concurrent.futures.Future`` objects: a
thread waits on one (or is called back), and ``Future.cancel()`` cancels the task behind it.
Nothing here blocks the loop for long; slow work (a built-in reading a file) goes to a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
FINISH_S = 5.0  # for the calls still running at close to end (a command killed, its reaping)


async def in_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on a daemon thread of its own. Unlike ``asyncio.to_thread`` (whose
    pool is joined at exit), a thread stuck in a read cannot keep localchat from exiting; a
    cancelled caller stops waiting at once and the thread ends on its own."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = function(*args)
        except BaseException as exc:
            _call_if_open(loop, settle, None, exc)
        else:
            _call_if_open(loop, settle, result, None)

    threading.Thread(target=work, daemon=True, name="localchat-tool-work").start()
    return await future


def _call_if_open(loop: asyncio.AbstractEventLoop, callback: Callable[..., None],
                  *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop closed while the thread worked: nobody waits any more
        pass


class AsyncThread:
    """The loop and its thread, started on first use; :meth:`close` stops both."""

    def __init__(self, name: str = "localchat-tools") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._thread else "idle"
        return f"<AsyncThread {self._name} {state}>"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the tools' asyncio thread was closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                ready = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(ready,), name=self._name,
                                                daemon=True)
                self._thread.start()
                ready.wait()
            return self._loop

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:  # as asyncio.run ends: what is still running is cancelled and awaited
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=FINISH_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop; its future's ``cancel()`` cancels it there."""
        try:
            loop = self.loop
        except RuntimeError:
            coroutine.close()
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def in_loop(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def close(self, shutdown: Coroutine[Any, Any, object] | None = None,
              timeout: float = 10.0) -> None:
        """Run ``shutdown`` (closing the sessions) if given, then stop the loop and its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            already, self._closed = self._closed, True
        if already or loop is None or thread is None:  # closed twice (the app and its services)
            if shutdown is not None:
                shutdown.close()
            return
        if shutdown is not None:
            try:
                asyncio.run_coroutine_threadsafe(shutdown, loop).result(timeout)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                pass  # a server that will not stop: the process exit reaps it
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout + FINISH_S)
