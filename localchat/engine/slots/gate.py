"""DecodeGate: the decodes of several slots made one llama_decode, stepped on the engine thread.

Each slot taking part in the batch (a *member*: its turn has begun) asks for its next decode
here. When every member is waiting, the thread that makes every llama.cpp computation of the
process (``post``: the engine's; a team of OpenMP threads per computing thread would make ggml
sleep between nodes) evaluates all of their parts in one batch: one token for each streaming
slot, a chunk of each prompt being prefilled (chunked prefill: a long prompt holds the streams up
for one chunk at a time, never for its whole prefill). A slot whose turn ends leaves
(``leave``), so the others never wait for it. Parts that do not fit ``n_batch`` wait for the
next step, first in line.

A slot's reply is *stepped* (``run_steps``): the engine thread itself takes each next token of
every streaming slot, right after the batch, and goes on to the next batch, where a thread per
slot woke up, sampled and met the others at the gate under the GIL for every token (measured:
1.1 ms between two 20 ms steps of 4 slots in ``serve``, ~0.15 ms of it per slot). A prefill
asks on its slot's own thread (``decode``) and waits.

Every other llama.cpp call of a slot (removing cells, restoring a state) is made under
``lock``, which a batch holds while it decodes; reading logits needs no lock: no decode can run
while a member reads them, since a batch waits for every member. A slot takes part from the
start of its turn (``join``), so its setup never waits for the others' steps; the lock is fair
(first come, first served), so whatever else takes it between steps (an embedding's decode)
waits for one step, never for a lone member's whole reply (Python's own locks let a thread that
releases one take it straight back: three slots waited 7 s for a fourth's reply to end).

When a slot's stream of the cache has no cells left for its part (``KVFull``: the engine checks
that a turn fits its slot, so this is a safety net), the largest part of the batch fails (its
turn ends with the error) and the others run again.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from localchat.engine.runtime import BatchPart, DecodeAborted, KVFull, LlamaRuntime
from localchat.engine.turn import Outbox


@dataclass
class Request:
    """A slot's decode, waiting at the gate; or work of its own (``action``: an image's
    evaluation, which calls llama_decode itself) that runs alone in a step. A stepped reply's
    request comes back with each next part (``steps``) until the reply ends."""

    part: BatchPart
    stop: Callable[[], bool] | None  # armed while the part is alone in its batch (prefill)
    action: Callable[[], None] | None = None
    # (Engine thread, after each decode of the part.) The next part, or None: it is over.
    steps: Callable[[Request], BatchPart | None] | None = None
    row: int = -1  # the batch index of its first token, once decoded
    logits: np.ndarray | None = None  # the rows of its outputs, once decoded
    error: BaseException | None = None
    woken: threading.Lock = field(default_factory=threading.Lock)  # released once it is over


@dataclass
class GateStats:
    """What the gate did (tests and the server's log read it)."""

    batches: int = 0
    most_parts: int = 0
    shared: int = 0  # batches that held more than one slot's part
    failed_full: int = 0  # parts that failed for want of cells


class FairLock:
    """A reentrant lock granted in the order it was asked for."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._queue: collections.deque[int] = collections.deque()

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            self._queue.append(me)
            while self._owner is not None or self._queue[0] != me:
                self._cond.wait()
            self._queue.popleft()
            self._owner, self._depth = me, 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()


class DecodeGate:
    def __init__(self, runtime: LlamaRuntime,
                 post: Callable[[Callable[[], None]], None] | None = None) -> None:
        """``post(work)``: queues ``work`` (a step) for the thread that makes every llama.cpp
        computation of the process, without waiting for it; raises when that thread will never
        run it (the engine has closed). None: whoever starts the steps runs them."""
        self.runtime = runtime
        self._post = post
        self.lock = FairLock()
        self.stats = GateStats()
        self._guard = threading.Lock()
        self._members: set[int] = set()
        self._waiting: list[Request] = []
        self._stepping = False
        self.outbox = Outbox()  # the events of the replies stepped on, held until each step ends

    @property
    def members(self) -> int:
        with self._guard:
            return len(self._members)

    def decode(self, part: BatchPart,
               stop: Callable[[], bool] | None = None) -> tuple[int, np.ndarray]:
        """Evaluate ``part`` with the other members' parts; the batch index of its first token
        and the logits of its outputs (a view, valid until the next step). Raises what the
        decode raised for it (DecodeAborted when ``stop`` ended it)."""
        request = Request(part, stop)
        self._wait(request)
        assert request.logits is not None
        return request.row, request.logits

    def run_steps(self, part: BatchPart, steps: Callable[[Request], BatchPart | None]) -> None:
        """Evaluate ``part``, then each part ``steps`` gives after it (called on the engine
        thread after every decode, with the request: its rows, or the error the decode raised),
        until it gives None. Raises the error it leaves on the request."""
        self._wait(Request(part, None, steps=steps))

    def run_alone(self, seq: int, action: Callable[[], None]) -> None:
        """Run ``action`` (llama.cpp work on slot ``seq``'s sequence that decodes by itself) as
        a step of its own: when every member waits, so none is reading logits it would
        overwrite. Raises what it raised."""
        self._wait(Request(BatchPart(seq, [], 0, 0), None, action))

    def _wait(self, request: Request) -> None:
        # Each request waits on a lock of its own, which its step releases.
        request.woken.acquire()
        with self._guard:
            self._members.add(request.part.seq)
            self._waiting.append(request)
            start = self._ready()
        if start:
            self._start()
        request.woken.acquire()
        if request.error is not None:
            raise request.error

    def _ready(self) -> bool:
        """(``_guard`` held.) Whether steps start now: every member waits and none runs; if so,
        they are marked running."""
        if self._stepping or not self._waiting or len(self._waiting) < len(self._members):
            return False
        self._stepping = True
        return True

    def _start(self) -> None:
        """Steps begin. On the computing thread, one step per job it is given, so that its
        other work (an embedding) runs between two steps; without one, here, for as long as
        they go on."""
        if self._post is None:
            while self._step():
                pass
            return
        try:
            self._post(self._step_then_post)
        except BaseException as exc:  # the computing thread takes no more work
            while self._step(exc):
                pass

    def _step_then_post(self) -> None:
        if self._step():
            self._start()

    def _step(self, refused: BaseException | None = None) -> bool:
        """One step: the waiting parts that fit one batch evaluated, the stepped replies
        stepped on, and the members whose request is over woken; whether another step is ready
        (stepped parts and leftovers that did not fit, with every member back)."""
        with self._guard:
            batch = self._take()
        over = batch
        try:
            if refused is not None:
                for request in batch:
                    request.error = refused
            else:
                self._run(batch)
                with self.outbox.collecting():
                    over = self._step_on(batch)
        finally:
            with self._guard:
                self._stepping = False
                again = self._ready()
            for request in over:
                request.woken.release()
        return again

    def _step_on(self, batch: list[Request]) -> list[Request]:
        """The stepped requests of ``batch`` take their next part (waiting again); those that
        are over."""
        over, going_on = [], []
        for request in batch:
            part = None
            if request.steps is not None:
                try:
                    part = request.steps(request)
                except BaseException as exc:  # handed to the slot whose reply it is
                    request.error = exc
            if part is None:
                over.append(request)
                continue
            request.part, request.row, request.logits, request.error = part, -1, None, None
            going_on.append(request)
        with self._guard:
            self._waiting += going_on
        return over

    def join(self, seq: int) -> None:
        """Slot ``seq`` takes part from now on (its turn has begun): the next batch waits for
        its part."""
        with self._guard:
            self._members.add(seq)

    def leave(self, seq: int) -> None:
        """Slot ``seq``'s turn is over: the batch no longer waits for it."""
        with self._guard:
            self._members.discard(seq)
            start = self._ready()
        if start:
            self._start()

    def _take(self) -> list[Request]:
        """(``_guard`` held.) The waiting parts that fit one batch, first come first."""
        action = next((r for r in self._waiting if r.action is not None), None)
        if action is not None:  # a step of its own
            self._waiting.remove(action)
            return [action]
        batch: list[Request] = []
        total = 0
        for request in list(self._waiting):
            size = len(request.part.tokens)
            if batch and total + size > self.runtime.n_batch:
                continue
            batch.append(request)
            total += size
            self._waiting.remove(request)
        return batch

    def _run(self, batch: list[Request]) -> None:
        if batch[0].action is not None:
            self._act(batch[0])
            return
        pending = list(batch)
        while pending:
            failed = self._decode(pending)
            if failed is None:
                break
            pending.remove(failed)

    def _act(self, request: Request) -> None:
        assert request.action is not None
        try:
            with self.lock:
                request.action()
        except BaseException as exc:  # handed to the slot that asked
            request.error = exc

    def _decode(self, pending: list[Request]) -> Request | None:
        """One llama_decode of ``pending``; the request that failed alone for want of cells
        (the others are to run again), else None."""
        runtime = self.runtime
        alone = pending[0].stop if len(pending) == 1 else None
        # In sequence order: llama.cpp makes one micro-batch of the slots' tokens only when their
        # sequence ids come in order (split streams); in the order the slots asked, it made
        # several (measured: a step of 4 slots' tokens 30.6 ms against 22.0 sorted).
        ordered = sorted(pending, key=lambda r: r.part.seq)
        with self.lock:
            try:
                runtime.arm_abort_check(alone)
                started = time.perf_counter()
                rows = runtime.decode_parts([r.part for r in ordered], alone is not None)
            except KVFull as exc:
                self.stats.failed_full += 1
                largest = max(pending, key=lambda r: len(r.part.tokens))
                largest.error = exc
                return largest if len(pending) > 1 else None
            except (DecodeAborted, Exception) as exc:
                for request in pending:
                    request.error = exc
                return None
            finally:
                runtime.arm_abort_check(None)
            if len(pending) == 1 and len(pending[0].part.tokens) == 1:
                # One slot streaming alone: the thread governor weighs its tokens as it does
                # the one-conversation engine's (shared steps say nothing about one token).
                runtime.governor.observe((time.perf_counter() - started) * 1000.0)
            table = runtime.settle_outputs(sum(r.part.outputs for r in ordered))
        first = 0
        for request, row in zip(ordered, rows):
            request.row = row
            request.logits = table[first:first + request.part.outputs]
            first += request.part.outputs
        self.stats.batches += 1
        self.stats.most_parts = max(self.stats.most_parts, len(pending))
        self.stats.shared += len(pending) > 1
        return None
