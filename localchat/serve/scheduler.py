"""The request queue: chat requests run one at a time on the engine, in arrival order, on a thread
of their own, so the event loop never waits on the engine (and the engine never on a socket).

- A request joins the queue (``Scheduler.submit``) or, with ``max_queue`` already waiting, is
  refused at once: 503 with ``Retry-After`` (the recent mean time per request times the queue).
- The running request is never cut by a new one: the next starts when its turn has ended.
- A request whose client went away while it waited is dropped before it runs; one whose client
  goes away while it runs is stopped within one token (``Turn.stop``), and what it decoded stays
  in the cache for the next request.
- A completion's prompt (``ChatRequest.prompt``) becomes tokens here, with the loaded model's
  vocabulary, and goes to the engine as they are (``Engine.submit_prompt``); one the model
  cannot take is the client's 400 (``Rejected``).
- An embeddings request (``task.Task``) takes its turn in the same queue: it may load a model
  or run on the chat engine's thread, so it never overlaps a turn.
- Before a turn the host loads the model the request names (a switch happens here, after the
  requests before it); the turn goes to the engine with the host's state pool
  (``engine.state_pool``), so each conversation's cache is found again however they interleave.

The thread hands each event to the job's asyncio queue (``loop.call_soon_threadsafe``); the
connection that owns the job reads them there.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass

from localchat.errors import UserError
from localchat.events import Done, Failed, Thinking, Token, Turn
from localchat.serve.chat_request import ChatRequest
from localchat.serve.http_errors import SHUTTING_DOWN, ApiError, Busy, ShuttingDown
from localchat.serve.model_host import ModelHost, ServedModel
from localchat.serve.task import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    """The job's turn has begun: which model answers, and how long loading it took (ms; 0 when
    it was loaded already); a completion's prompt tokens."""

    model: str
    load_ms: float
    prompt: tuple[int, ...] = ()


@dataclass(frozen=True)
class Rejected:
    """The loaded model cannot take the request's prompt (``ChatRequest.prompt``): a 400."""

    error: ApiError


JobEvent = Started | Rejected | Token | Thinking | Done | Failed


class Job:
    """One chat request between its connection (event loop) and the scheduler (its thread)."""

    def __init__(self, request: ChatRequest, model: ServedModel, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.model = model
        self.events: asyncio.Queue[JobEvent] = asyncio.Queue()
        self.arrived_at = time.perf_counter()
        self._loop = loop
        self._lock = threading.Lock()
        self._turn: Turn | None = None
        self.cancelled = False  # the client went away (or the server is stopping)
        self.shutting_down = False
        self.finished = False

    def deliver(self, event: JobEvent) -> None:
        """(Scheduler thread.) Hand ``event`` to the connection."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is reading any more
            pass

    def attach(self, turn: Turn) -> None:
        with self._lock:
            self._turn = turn
            stop = self.cancelled
        if stop:
            turn.stop()

    def cancel(self, shutting_down: bool = False) -> None:
        """(Any thread.) Nobody will read the reply: drop the request, or stop its turn."""
        with self._lock:
            self.cancelled = True
            self.shutting_down = self.shutting_down or shutting_down
            turn = self._turn
        if turn is not None:
            turn.stop()

    def stop_reply(self) -> None:
        """(Any thread.) The reply is complete (a stop string): end the turn, keep reading."""
        with self._lock:
            turn = self._turn
        if turn is not None:
            turn.stop()


class Scheduler:
    """Runs jobs in arrival order on one thread; see the module docstring."""

    def __init__(self, host: ModelHost, max_queue: int) -> None:
        self.host = host
        self.max_queue = max_queue
        self._waiting: collections.deque[Job | Task] = collections.deque()
        self._running: Job | Task | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self.served = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._serve, name="localchat-serve-queue", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        with self._cond:
            return sum(1 for job in self._waiting if not job.cancelled)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits."""
        with self._cond:
            return self._running is None and not any(not j.cancelled for j in self._waiting)

    def submit(self, job: Job | Task) -> None:
        """Queue ``job``; Busy (503, with Retry-After) when ``max_queue`` already wait,
        ShuttingDown when the server is stopping."""
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            waiting = sum(1 for j in self._waiting if not j.cancelled)
            if waiting + (self._running is not None) > self.max_queue:  # one runs, the rest wait
                raise Busy(waiting, self._retry_after(waiting))
            self._waiting.append(job)
            self._cond.notify()

    def _retry_after(self, waiting: int) -> int:
        mean = sum(self._durations) / len(self._durations) if self._durations else 5.0
        return max(1, math.ceil(mean * (waiting + 1)))

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, cancel the waiting ones (they end with a shutdown error), stop the
        running one within a token, and wait for the thread."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            running = self._running
            self._cond.notify()
        for job in waiting:
            job.cancel(shutting_down=True)
            job.deliver(Failed(SHUTTING_DOWN, code="shutting_down"))
        if running is not None:
            running.cancel(shutting_down=True)
        self._thread.join(timeout)

    # -- the scheduler thread ------------------------------------------------------------------

    def _next(self) -> Job | Task | None:
        with self._cond:
            while True:
                while self._waiting:
                    job = self._waiting.popleft()
                    if not job.cancelled:
                        self._running = job
                        return job
                    self.dropped += 1  # its client left while it waited: never run
                if self._closed:
                    return None
                self._cond.wait()

    def _serve(self) -> None:
        while (job := self._next()) is not None:
            started = time.perf_counter()
            try:
                self._run(job)
            except Exception as exc:  # a bug must still end the request
                log.exception("a request failed in the scheduler")
                job.deliver(Failed(f"server error: {type(exc).__name__}: {exc}"))
            finally:
                with self._cond:
                    self._running = None
                self._durations.append(time.perf_counter() - started)
                self.served += 1

    def _run(self, job: Job | Task) -> None:
        if isinstance(job, Task):  # an embeddings request, in its turn
            job.run(self.host)
            return
        try:
            engine, pool, load_ms = self.host.acquire(job.model)
        except UserError as exc:
            job.deliver(Failed(str(exc), code="model_not_loaded"))
            return
        sampling = job.request.sampling_over(self.host.sampling)
        recipe = job.request.prompt
        if recipe is None:
            job.deliver(Started(job.model.name, load_ms))
            turn = engine.submit(job.request.messages, sampling, pool=pool)
        else:
            try:
                prompt = recipe.build(engine, job.model.name)
            except ApiError as exc:
                job.deliver(Rejected(exc))
                return
            except UserError as exc:  # the chat template refused Ollama's prompt
                job.deliver(Failed(str(exc), code="conversation_rejected"))
                return
            job.deliver(Started(job.model.name, load_ms, prompt.tokens))
            turn = engine.submit_prompt(prompt, sampling, pool)
        job.attach(turn)
        for event in turn:
            if isinstance(event, (Token, Thinking, Done, Failed)):
                job.deliver(event)
