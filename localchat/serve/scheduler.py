"""The request queue: chat requests start in arrival order, up to the host's ``parallel`` at once
(``engine.slots``: each on a slot of one context, decoded together), each on a thread of its own,
so the event loop never waits on the engine (and the engine never on a socket).

- A request joins the queue (``Scheduler.submit``) or, with ``max_queue`` already waiting, is
  refused at once: 503 with ``Retry-After`` (the recent mean time per request times the queue,
  shared by the slots).
- A running request is never cut by a new one: a new one takes a free slot, or waits for one.
- A request whose client went away while it waited is dropped before it runs; one whose client
  goes away while it runs is stopped within one token (``Turn.stop``), and what it decoded stays
  in its slot's cache for the next request.
- A completion's prompt (``ChatRequest.prompt``) becomes tokens here, with the loaded model's
  vocabulary, and goes to the engine as they are (``Engine.submit_prompt``); one the model
  cannot take is the client's 400 (``Rejected``).
- An embeddings request (``task.Task``) takes its turn in the same queue and runs alone: the
  chats before it end first, the requests after it wait for it. Beside the slots, its own context
  and theirs would decode on the same cores, each one's threads spinning while the other's run
  (measured: four chat streams fell to 12-22 tokens/s each, and taking turns decode by decode
  halved their throughput again).
- A request for a model other than the loaded one waits until every running request has ended,
  then the host switches (``ModelHost.acquire``); the requests behind it wait for it. The turn
  goes to the engine with the host's state pool (``engine.state_pool``), so each conversation's
  cache is found again however they interleave.

Each job's thread hands its events to the job's asyncio queue (``loop.call_soon_threadsafe``);
the connection that owns the job reads them there.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass

from localchat.engine.turn import TurnHandle
from localchat.errors import UserError
from localchat.events import Done, Failed, Thinking, Token
from localchat.serve.chat_request import ChatRequest
from localchat.serve.http_errors import SHUTTING_DOWN, ApiError, Busy, ShuttingDown
from localchat.serve.model_host import ModelHost, ServedModel
from localchat.serve.task import Task

log = logging.getLogger(__name__)

# How long a streamed reply's turn waits, after its first text, for the event loop to have sent
# it (``TurnHandle.hold_first_text``); it takes well under a millisecond when a core is free.
FIRST_TEXT_HOLD_S = 0.005


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
        self._turn: TurnHandle | None = None
        self.cancelled = False  # the client went away (or the server is stopping)
        self.shutting_down = False
        self.finished = False

    def deliver(self, event: JobEvent) -> None:
        """(Scheduler thread.) Hand ``event`` to the connection."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is reading any more
            pass

    def attach(self, turn: TurnHandle) -> None:
        if self.request.stream:  # its first text goes out before the next decode takes the cores
            turn.hold_first_text(FIRST_TEXT_HOLD_S)
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

    def first_text_sent(self) -> None:
        """(Event loop.) The reply's first text is on its way to the client (``attach``)."""
        with self._lock:
            turn = self._turn
        if turn is not None:
            turn.first_text_shown()

    def stop_reply(self) -> None:
        """(Any thread.) The reply is complete (a stop string): end the turn, keep reading."""
        with self._lock:
            turn = self._turn
        if turn is not None:
            turn.stop()


class Scheduler:
    """Starts jobs in arrival order, up to ``host.parallel`` chats at once; see the module doc."""

    def __init__(self, host: ModelHost, max_queue: int) -> None:
        self.host = host
        self.max_queue = max_queue
        self.parallel = max(1, host.parallel)
        self._waiting: collections.deque[Job | Task] = collections.deque()
        self._running: list[Job | Task] = []
        self._threads: set[threading.Thread] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self.served = 0
        self.dropped = 0
        self.most_running = 0  # the most chats that ran at once (the server's log, tests)
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
            return not self._running and not any(not j.cancelled for j in self._waiting)

    def submit(self, job: Job | Task) -> None:
        """Queue ``job``; Busy (503, with Retry-After) when ``max_queue`` already wait,
        ShuttingDown when the server is stopping."""
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            waiting = sum(1 for j in self._waiting if not j.cancelled)
            if waiting + len(self._running) > self.max_queue + self.parallel - 1:
                raise Busy(waiting, self._retry_after(waiting))
            self._waiting.append(job)
            self._cond.notify_all()

    def _retry_after(self, waiting: int) -> int:
        mean = sum(self._durations) / len(self._durations) if self._durations else 5.0
        return max(1, math.ceil(mean * (waiting + 1) / self.parallel))

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, cancel the waiting ones (they end with a shutdown error), stop the
        running ones within a token, and wait for their threads."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            running = list(self._running)
            self._cond.notify_all()
        for job in waiting:
            job.cancel(shutting_down=True)
            job.deliver(Failed(SHUTTING_DOWN, code="shutting_down"))
        for job in running:
            job.cancel(shutting_down=True)
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        with self._cond:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- the scheduler thread ------------------------------------------------------------------

    def _next(self) -> Job | Task | None:
        with self._cond:
            while True:
                while self._waiting and self._waiting[0].cancelled:
                    self._waiting.popleft()
                    self.dropped += 1  # its client left while it waited: never run
                if self._waiting and self._can_start(self._waiting[0]):
                    job = self._waiting.popleft()
                    self._running.append(job)
                    self.most_running = max(self.most_running,
                                            sum(isinstance(j, Job) for j in self._running))
                    return job
                if self._closed:
                    return None
                self._cond.wait()

    def _can_start(self, job: Job | Task) -> bool:
        """(Condition held.) Whether ``job`` may start beside the running ones."""
        if not self._running:
            return True
        if isinstance(job, Task):  # never beside a chat: see the module doc
            return False
        return (job.model == self.host.loaded  # another model waits for the switch
                and sum(isinstance(j, Job) for j in self._running) < self.parallel)

    def _serve(self) -> None:
        while (job := self._next()) is not None:
            thread = threading.Thread(target=self._run_one, args=(job,),
                                      name="localchat-serve-job", daemon=True)
            with self._cond:
                self._threads.add(thread)
            thread.start()

    def _run_one(self, job: Job | Task) -> None:
        started = time.perf_counter()
        try:
            self._run(job)
        except Exception as exc:  # a bug must still end the request
            log.exception("a request failed in the scheduler")
            job.deliver(Failed(f"server error: {type(exc).__name__}: {exc}"))
        finally:
            with self._cond:
                self._running.remove(job)
                self._threads.discard(threading.current_thread())
                self._durations.append(time.perf_counter() - started)
                self.served += 1
                self._cond.notify_all()

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
