"""Work other than a chat turn that takes its turn in the request queue (``scheduler``): an
embeddings request, which may load a model or run on the chat engine's thread. It starts in its
turn, once the running chats have ended, and the requests after it wait for it (``scheduler``).

A :class:`Task` runs ``work(host)`` on a thread of the scheduler's; the connection awaits its
result (``await task.result()``), or the error it raised (an ``http_errors.ApiError`` answered as it
is; a model that cannot be loaded a 500). The scheduler treats it as a job: it can be cancelled
while it waits, and is ended with the shutdown error when the server stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from localchat.errors import UserError
from localchat.events import Failed
from localchat.serve.http_errors import ApiError, ReplyFailed, ShuttingDown

if TYPE_CHECKING:
    from localchat.serve.model_host import ModelHost

log = logging.getLogger(__name__)


class Task:
    """``work(host)`` queued like a chat job; see the module docstring."""

    def __init__(self, work: Callable[[ModelHost], Any]) -> None:
        self._work = work
        self._future: Future[Any] = Future()
        self.cancelled = False

    def run(self, host: ModelHost) -> None:
        """(A job thread of the scheduler.) Run the work and hand over its result or error."""
        if self._future.done():
            return
        try:
            result = self._work(host)
        except ApiError as exc:
            self._settle(exc)
        except UserError as exc:  # a model that cannot be loaded
            self._settle(ReplyFailed(str(exc), code="model_not_loaded"))
        except Exception as exc:  # a bug must still answer the request
            log.exception("a task failed in the scheduler")
            self._settle(ReplyFailed(f"server error: {type(exc).__name__}: {exc}"))
        else:
            self._settle(None, result)

    def _settle(self, error: BaseException | None, result: Any = None) -> None:
        """Hand over ``error`` or ``result``, unless the task has already ended (the server
        stopping ends it from another thread)."""
        try:
            if error is not None:
                self._future.set_exception(error)
            else:
                self._future.set_result(result)
        except InvalidStateError:
            pass

    async def result(self) -> Any:
        return await asyncio.wrap_future(self._future)

    # -- what the scheduler asks of a job -----------------------------------------------------

    def cancel(self, shutting_down: bool = False) -> None:
        """Not run if it still waits (a running task is short: it ends with its answer)."""
        self.cancelled = True

    def deliver(self, event: Failed) -> None:
        """The scheduler ended the task with ``event`` (the server stopping, or a bug)."""
        self._settle(ShuttingDown() if event.code == "shutting_down"
                     else ReplyFailed(event.message, event.code))
