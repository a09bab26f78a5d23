"""DecodeGate: the decodes of several slots, each asked on its own thread, made one llama_decode.

Each slot taking part in the batch (a *member*: it has decoded since its turn began) asks for
its next decode here and waits. When every member is waiting, one of them (the last to arrive)
has all of their parts evaluated in one batch, on the one thread that computes (``run_on``: the
engine's; a team of OpenMP threads per computing thread would make ggml sleep between nodes): one token for each streaming slot, a chunk of each
prompt being prefilled (chunked prefill: a long prompt holds the streams up for one chunk at a
time, never for its whole prefill). A slot whose turn ends leaves (``leave``), so the others
never wait for it. Parts that do not fit ``n_batch`` wait for the next step, first in line.

Every other llama.cpp call of a slot (removing cells, restoring a state) is made under
``lock``, which a batch holds while it decodes; a member's sampling needs no lock: no decode can
run while it samples, since a batch waits for every member. A slot takes part from the start of
its turn (``join``), so its setup never waits for the others' steps; the lock is fair (first
come, first served), so whatever else takes it between steps (an embedding's decode) waits for
one step, never for a lone member's whole reply (Python's own locks let a thread that releases
one take it straight back: three slots waited 7 s for a fourth's reply to end).

When a slot's stream of the cache has no cells left for its part (``KVFull``: the engine checks
that a turn fits its slot, so this is a safety net), the largest part of the batch fails (its
turn ends with the error) and the others run again.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from localchat.engine.runtime import BatchPart, DecodeAborted, KVFull, LlamaRuntime

T = TypeVar("T")


@dataclass
class Request:
    """A slot's decode, waiting at the gate; or work of its own (``action``: an image's
    evaluation, which calls llama_decode itself) that runs alone in a step."""

    part: BatchPart
    stop: Callable[[], bool] | None  # armed while the part is alone in its batch (prefill)
    action: Callable[[], None] | None = None
    row: int = -1  # the batch index of its first token, once decoded
    error: BaseException | None = None
    done: bool = False


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


def _here(work: Callable[[], T]) -> T:
    return work()


class DecodeGate:
    def __init__(self, runtime: LlamaRuntime,
                 run_on: Callable[[Callable[[], None]], None] = _here) -> None:
        """``run_on(work)``: runs ``work`` (a batch, an image's evaluation) on the thread that
        makes every llama.cpp computation of the process, and returns when it has run."""
        self.runtime = runtime
        self._run_on = run_on
        self.lock = FairLock()
        self.stats = GateStats()
        self._cond = threading.Condition()
        self._members: set[int] = set()
        self._waiting: list[Request] = []
        self._leading = False

    @property
    def members(self) -> int:
        with self._cond:
            return len(self._members)

    def decode(self, part: BatchPart, stop: Callable[[], bool] | None = None) -> int:
        """Evaluate ``part`` with the other members' parts; the batch index of its first token.
        Raises what the decode raised for it (DecodeAborted when ``stop`` ended it)."""
        return self._wait(Request(part, stop))

    def run_alone(self, seq: int, action: Callable[[], None]) -> None:
        """Run ``action`` (llama.cpp work on slot ``seq``'s sequence that decodes by itself) as
        a step of its own: when every member waits, so none is reading logits it would
        overwrite. Raises what it raised."""
        self._wait(Request(BatchPart(seq, [], 0, 0), None, action))

    def _wait(self, request: Request) -> int:
        part = request.part
        with self._cond:
            self._members.add(part.seq)
            self._waiting.append(request)
            while not request.done:
                if self._leading or len(self._waiting) < len(self._members):
                    self._cond.wait()
                    continue
                self._leading = True
                batch = self._take()
                self._cond.release()
                try:
                    self._run_on(functools.partial(self._run, batch))
                except BaseException as exc:  # the computing thread took no more work
                    for waiting in batch:
                        if not waiting.done:
                            waiting.error, waiting.done = exc, True
                finally:
                    self._cond.acquire()
                    self._leading = False
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        return request.row

    def join(self, seq: int) -> None:
        """Slot ``seq`` takes part from now on (its turn has begun): the next batch waits for
        its part."""
        with self._cond:
            self._members.add(seq)

    def leave(self, seq: int) -> None:
        """Slot ``seq``'s turn is over: the batch no longer waits for it."""
        with self._cond:
            self._members.discard(seq)
            self._cond.notify_all()

    def _take(self) -> list[Request]:
        """(Condition held.) The waiting parts that fit one batch, first come first."""
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
        try:
            while pending:
                failed = self._decode(pending)
                if failed is None:
                    break
                pending.remove(failed)
        finally:
            for request in batch:
                request.done = True

    def _act(self, request: Request) -> None:
        assert request.action is not None
        try:
            with self.lock:
                request.action()
        except BaseException as exc:  # handed to the slot that asked
            request.error = exc
        finally:
            request.done = True

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
            runtime.settle_outputs()
        for request, row in zip(ordered, rows):
            request.row = row
        self.stats.batches += 1
        self.stats.most_parts = max(self.stats.most_parts, len(pending))
        self.stats.shared += len(pending) > 1
        return None
