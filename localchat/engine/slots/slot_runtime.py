"""SlotRuntime: the runtime as one slot's turn sees it, bound to the slot's sequence.

A slot's ``ConversationCache``, its turn and its sampler run unchanged over this view: every
cache edit names the slot's sequence, every decode goes through the ``DecodeGate`` (one batch
with the other slots; a reply's, stepped on by the engine thread: ``drive``), and the logits a
turn asks for are its own rows of that batch, read from a view of them without a call into
llama.cpp. Everything else (the vocabulary, the piece and end-of-generation tables) is the
shared runtime's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

import numpy as np

from localchat.engine.options import Sampling
from localchat.engine.runtime import BatchPart, LlamaRuntime
from localchat.engine.sampling.sampler import Sampler, TokenJudge
from localchat.engine.slots.gate import DecodeGate, Request
from localchat.engine.threads import ThreadGovernor
from localchat.errors import EngineError

T = TypeVar("T")


class QuietGovernor:
    """A slot's decode time includes the waits for other slots: the slot tells the thread
    governor nothing (the gate times the batches that hold one token alone), and reads the count
    the shared runtime's governor holds."""

    def __init__(self, governor: ThreadGovernor) -> None:
        self._governor = governor

    @property
    def threads(self) -> int:
        return self._governor.threads

    def observe(self, ms_per_token: float) -> None:
        pass


class SlotRuntime(LlamaRuntime):
    """``base`` bound to sequence ``seq``; made without loading anything (a view)."""

    def __init__(self, base: LlamaRuntime, seq: int, gate: DecodeGate) -> None:  # noqa: D107
        # A view: the loaded model, context and tables are the base's own objects.
        self.__dict__.update(base.__dict__)
        self.seq = seq
        self._gate = gate
        self._abort_requested = threading.Event()
        self.abort_check = self._abort_requested.is_set
        self.governor = QuietGovernor(base.governor)  # type: ignore[assignment]
        self._first_row = 0
        self._n_rows = 0
        self._outputs: np.ndarray | None = None  # the logits of the last decode's last tokens

    def decode(self, tokens: list[int], start_pos: int, abortable: bool = False,
               outputs: int = 1) -> None:
        stop = self._abort_requested.is_set if abortable else None
        part = BatchPart(self.seq, tokens, start_pos, outputs)
        self._took(part, *self._gate.decode(part, stop))

    def drive(self, steps: Generator[BatchPart, None, T]) -> T:
        """The generation's first token here; every decode after it, and the sampling and the
        events that follow each, on the engine thread with the other slots' (``run_steps``)."""
        try:
            first = next(steps)
        except StopIteration as done:
            return done.value
        result: list[T] = []

        def step(request: Request) -> BatchPart | None:
            try:
                if request.error is not None:
                    error, request.error = request.error, None
                    return steps.throw(error)
                assert request.logits is not None
                self._took(request.part, request.row, request.logits)
                return steps.send(None)
            except StopIteration as done:
                result.append(done.value)
                return None

        try:
            self._gate.run_steps(first, step)
        finally:
            steps.close()  # a generation the engine never stepped on ends here, cleanly
        return result[0]

    def _took(self, part: BatchPart, row: int, logits: np.ndarray) -> None:
        """``part`` was decoded: its first token at batch index ``row``, its outputs' logits."""
        self._first_row, self._outputs = row, logits
        self._n_rows = len(part.tokens)

    def alone(self, action: Callable[[], None]) -> None:
        """``action`` as a step of its own at the gate (an image's evaluation)."""
        self._outputs = None  # its decodes are libmtmd's: llama.cpp's buffer has the rows
        self._gate.run_alone(self.seq, action)

    @contextlib.contextmanager
    def armed_abort(self) -> Iterator[None]:
        """(In a step of its own: ``alone``.) The callback asks this slot's stop."""
        base = self._gate.runtime
        base.arm_abort_check(self._abort_requested.is_set)
        try:
            with super().armed_abort():
                yield
        finally:
            base.arm_abort_check(None)

    def row(self, index: int) -> int:
        """The batch index of this slot's ``index``-th token in the last batch (-1: its last)."""
        return self._first_row + (self._n_rows - 1 if index == -1 else index)

    def logits_at(self, index: int) -> np.ndarray:
        if self._outputs is None:
            return super().logits_at(self.row(index))
        outputs = self._outputs
        output = len(outputs) - 1 if index == -1 else index - (self._n_rows - len(outputs))
        if not 0 <= output < len(outputs):
            raise EngineError(f"token {index} of the last decode has no logits")
        return outputs[output]

    def new_sampler(self, sampling: Sampling, constraint: TokenJudge | None = None) -> Sampler:
        return Sampler(self._lib, sampling, self.ctx, self.logits_at, constraint, row=self.row)

    # Cache edits: never while a batch decodes.

    def remove(self, start: int, end: int) -> bool:
        with self._gate.lock:
            return super().remove(start, end)

    def move(self, start: int, end: int, delta: int) -> None:
        with self._gate.lock:
            super().move(start, end, delta)

    def clear(self) -> None:
        with self._gate.lock:
            super().clear()

    def min_position(self) -> int:
        with self._gate.lock:
            return super().min_position()

    def max_position(self) -> int:
        with self._gate.lock:
            return super().max_position()

    def export_sequence(self) -> memoryview:
        with self._gate.lock:
            return super().export_sequence()

    def checkpoint_data(self) -> bytes:
        with self._gate.lock:
            return super().checkpoint_data()

    def restore_checkpoint(self, data: bytes, n_tokens: int) -> bool:
        with self._gate.lock:
            return super().restore_checkpoint(data, n_tokens)

    def import_sequence(self, data: bytes | memoryview) -> bool:
        with self._gate.lock:
            return super().import_sequence(data)

    def close(self) -> None:
        """The base owns the model and context."""

    def __repr__(self) -> str:
        return f"SlotRuntime(seq={self.seq})"
