"""ParallelEngine: an Engine whose turns run side by side, one per slot, in one llama.cpp context.

``localchat serve --parallel N`` answers N requests at once. The context holds N sequences, each
with n_ctx cells of its own (as Ollama multiplies the context by its parallel requests: every
conversation keeps the context it has with one slot); each slot is a sequence with its own
``ConversationCache`` (its per-message records: exact-prefix reuse, the greedy oracle and trims
hold per slot as for the one-conversation engine) seen through a ``SlotRuntime``. A turn runs on
a thread of its own, exactly as ``Engine._turn`` runs it, with its own sampler, grammar and stop;
its decodes meet the other slots' at the ``DecodeGate``, which evaluates one token of each
streaming slot and a chunk of each prompt in one batch (continuous batching). Once its reply
streams, the engine thread steps it on with the others' (``SlotRuntime.drive``): each next token
is taken right after the batch, with no thread of the slot's waking for it.

- A turn takes the idle slot whose cells keep the most of it (``choice``), then the RAM state
  pool may offer a better state (``state_pool``, as for one slot); with every slot busy it waits,
  first come first served.
- A stop or a client gone ends that slot's turn only (within one token, or one chunk of a
  prefill shared with other slots).
- Speculative decoding is off: a drafted check would make every other slot's step wait for it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from localchat.engine.engine import CLOSED, Engine
from localchat.engine.image_records import with_image_tags
from localchat.engine.kv import ConversationCache
from localchat.engine.layout import ChatPrompt, RawPrompt
from localchat.engine.options import EngineOptions, Sampling
from localchat.engine.slots.choice import SlotState, choose_slot
from localchat.engine.slots.gate import DecodeGate, GateStats
from localchat.engine.slots.slot_runtime import SlotRuntime
from localchat.engine.state_pool import StatePool, StateView, Wanted
from localchat.engine.turn import TurnHandle
from localchat.errors import EngineError, UserError
from localchat.events import Failed, Loaded

SPECULATION_OFF = "speculative decoding is off while several slots decode together"


@dataclass
class Slot:
    seq: int
    kv: ConversationCache
    handle: TurnHandle | None = None  # the turn it runs; None: idle
    thread: threading.Thread | None = None
    last_used: float = 0.0
    reserved: bool = False  # chosen for a turn whose thread has not started yet

    @property
    def busy(self) -> bool:
        return self.reserved or self.handle is not None

    def state(self) -> SlotState:
        kv = self.kv
        checkpoints = [c.n_tokens for c in kv.checkpoints] if kv.uses_checkpoints else None
        return SlotState(self.seq, StateView(kv.records, kv.exact_n, checkpoints), self.last_used)


@dataclass
class _Waiting:
    handle: TurnHandle
    wanted: Wanted  # what it would keep of a slot's cells is weighed against this (``choice``)
    body: Callable[[ConversationCache], None]


class ParallelEngine(Engine):
    """``Engine`` with ``options.parallel`` slots (see the module doc). Foreground turns only:
    a background job (a summary, ``prepare``) is the one-conversation app's."""

    def __init__(self, model_path: Path, options: EngineOptions, name: str = "",
                 notices: Sequence[str] = ()) -> None:
        if options.parallel < 1:
            raise EngineError(f"parallel must be at least 1, not {options.parallel}")
        off = options.parallel > 1 and options.speculative != "off"
        if options.parallel > 1:
            # Several slots decode in one batch: flash attention (llama-server's default on a
            # CPU) makes a step of 4 slots' tokens 19.5 ms instead of 24.2 (the test model,
            # 2 cores, 300 cells each), and one slot's 7.0 instead of 7.7.
            options = replace(options, flash_attn=True)
        super().__init__(model_path, replace(options, speculative="off") if off else options,
                         name, [*notices, *([SPECULATION_OFF] if off else [])])
        self._slots: list[Slot] = []
        self._slots_lock = threading.Lock()
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._stopping = False
        self._gate: DecodeGate | None = None

    @property
    def n_slots(self) -> int:
        return self.options.parallel

    @property
    def gate_stats(self) -> GateStats:
        return self._gate.stats if self._gate is not None else GateStats()

    # -- turns ---------------------------------------------------------------------------------

    def submit(self, messages: list[dict[str, str]], sampling: Sampling | None = None, *,
               background: bool = False, pool: StatePool | None = None) -> TurnHandle:
        if background:
            raise EngineError("parallel slots run foreground turns only")
        handle = TurnHandle(on_stop=self._stop_handle)
        snapshot = [dict(m) for m in messages]
        chosen = sampling or Sampling()
        self._dispatch(_Waiting(handle, self._wanted(snapshot, chosen), lambda kv: self._foreground_turn(
            handle, snapshot, chosen, pool, kv=kv)))
        return handle

    def _wanted(self, messages: list[dict], sampling: Sampling) -> ChatPrompt:
        """The prompt a turn for ``messages`` lays out, rendered here on the caller's thread (a
        slot is chosen under the slots' lock). The records hold a picture as its tag
        (``image_records``). A conversation the template refuses keeps nothing anywhere: its turn
        then fails with why."""
        shaped = with_image_tags(messages)[0]
        try:
            return self._prompts.chat_prompt(shaped, sampling, self._prompts.tool_plan(shaped, sampling))
        except UserError:
            return ChatPrompt(shaped, "")

    def submit_prompt(self, prompt: RawPrompt, sampling: Sampling,
                      pool: StatePool | None = None) -> TurnHandle:
        handle = TurnHandle(on_stop=self._stop_handle)
        self._dispatch(_Waiting(handle, prompt, lambda kv: self._turn(
            handle, [], sampling, pool=pool, raw=prompt, kv=kv)))
        return handle

    def prepare(self, messages: list[dict[str, str]],
                tools: tuple = ()) -> TurnHandle:
        raise EngineError("parallel slots run foreground turns only")

    def stop(self) -> None:
        """Stop every running turn."""
        with self._slots_lock:
            handles = [slot.handle for slot in self._slots if slot.handle is not None]
        for handle in handles:
            handle.stop()

    def reset(self) -> None:
        """Empty every idle slot's cells."""
        with self._slots_lock:
            for slot in self._slots:
                if not slot.busy:
                    slot.kv.forget()

    def close(self) -> None:
        with self._slots_lock:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            running = [slot for slot in self._slots if slot.thread is not None]
        for item in waiting:
            item.handle.emit(Failed(CLOSED))
        for slot in running:
            if slot.handle is not None:
                slot.handle.stop()
            if slot.thread is not None:
                slot.thread.join(timeout=30)
        super().close()

    def _dispatch(self, item: _Waiting) -> None:
        with self._slots_lock:
            if not self._stopping:
                self._waiting.append(item)
                self._start_waiting()
                return
        item.handle.emit(Failed(CLOSED))

    def _start_waiting(self) -> None:
        """(Slots lock held.) Start waiting turns on idle slots, first come first served."""
        while self._waiting and self._slots:
            idle = [slot for slot in self._slots if not slot.busy]
            if not idle:
                return
            # A slot whose turn has just ended (its thread is letting go) still counts: the
            # client's next request, sent as soon as the reply ended, belongs in its cells.
            ending = [slot for slot in self._slots if slot.handle is not None
                      and slot.handle.finished]
            chosen = choose_slot([slot.state() for slot in idle + ending], self._waiting[0].wanted)
            slot = self._slots[chosen.seq]
            if slot.busy:
                return  # started there once its thread has let go (``_run_slot``)
            item = self._waiting.popleft()
            slot.reserved = True
            # It takes part from now on: requests that arrive together prefill in one step
            # (the first no longer runs its prompt alone while the others' threads start).
            if self._gate is not None:
                self._gate.join(slot.seq)
            slot.thread = threading.Thread(target=self._run_slot, args=(slot, item),
                                           name=f"localchat-slot-{slot.seq}", daemon=True)
            slot.thread.start()

    def _run_slot(self, slot: Slot, item: _Waiting) -> None:
        gate = self._gate
        assert gate is not None
        with self._slots_lock:
            slot.handle, slot.reserved = item.handle, False
        item.handle.deliver_through(gate.outbox)
        try:
            self._run_job(item.handle, lambda: item.body(slot.kv), False, kv=slot.kv)
        finally:
            gate.leave(slot.seq)
            with self._slots_lock:
                slot.handle, slot.thread = None, None
                slot.last_used = time.monotonic()
                self._kv = slot.kv  # what ``cached_messages`` and the like read: the last turn's
                if not self._stopping:
                    self._start_waiting()

    def _begin_job(self, handle: TurnHandle) -> None:
        slot = self._slot_of(handle)
        if slot is not None:
            slot.kv.runtime.clear_abort()

    def _end_job(self, handle: TurnHandle) -> None:
        """Nothing to note: each slot's turn is its thread's."""

    def _stop_handle(self, handle: TurnHandle) -> None:
        slot = self._slot_of(handle)
        if slot is not None:
            slot.kv.runtime.request_abort()

    def _slot_of(self, handle: TurnHandle) -> Slot | None:
        with self._slots_lock:
            return next((slot for slot in self._slots if slot.handle is handle), None)

    # -- loading and room ----------------------------------------------------------------------

    def _load(self, on_progress: Callable[[float], None] | None) -> Loaded:
        info = super()._load(on_progress)
        runtime = self._require_runtime()
        self._gate = DecodeGate(runtime, self._post)
        with self._slots_lock:
            self._slots = [Slot(seq, ConversationCache(SlotRuntime(runtime, seq, self._gate),
                                                       self.options.checkpoints))
                           for seq in range(runtime.n_seq)]
        self._kv = self._slots[0].kv  # what the one-conversation methods read (see _run_slot)
        return info

    def _post(self, step: Callable[[], None]) -> None:
        """Every llama.cpp computation on the engine thread (embeddings run there too), each
        step a job of its own (the others' work runs between two). ggml's OpenMP keeps a team
        of threads for each thread that computes; with two teams alive on a 2-core CPU it stops
        spinning between graph nodes and sleeps: measured, 18 ms a token instead of 7.3 once an
        embeddings request had run on the engine thread while slots decoded on their own."""
        if not self._queue(step):
            raise EngineError(CLOSED)

    @property
    def _chunk_cap(self) -> int:
        """A prompt chunk leaves room in the batch for one token of every other slot."""
        return max(1, self._require_runtime().n_batch - (self.n_slots - 1))
