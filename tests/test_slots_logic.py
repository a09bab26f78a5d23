"""The parallel slots' plain logic, without a model: the decode gate batches the decodes of every
slot taking part into one call, releases the others when a slot leaves, keeps a batch within
n_batch, and fails only the part that found no cells; a new request takes the slot whose records
keep the most of it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from localchat.engine.layout import CachedMessage, ChatPrompt, RawPrompt
from localchat.engine.runtime import BatchPart, KVFull
from localchat.engine.slots.choice import SlotState, choose_slot
from localchat.engine.slots.gate import DecodeGate
from localchat.engine.state_pool import StateView
from localchat.errors import EngineError


class FakeRuntime:
    """Records each batch; the first ``full`` calls raise KVFull."""

    def __init__(self, n_batch: int = 512, full: int = 0) -> None:
        self.n_batch = n_batch
        self.batches: list[list[tuple[int, int]]] = []
        self.full = full
        self.armed: list[bool] = []
        self.timed: list[float] = []  # single-token batches the thread governor was told of
        self.governor = self

    def observe(self, ms: float) -> None:
        self.timed.append(ms)

    def decode_parts(self, parts, abortable=False):
        if self.full:
            self.full -= 1
            raise KVFull("full")
        self.batches.append([(p.seq, len(p.tokens)) for p in parts])
        self.armed.append(abortable)
        rows, i = [], 0
        for part in parts:
            rows.append(i)
            i += len(part.tokens)
        return rows

    def arm_abort_check(self, check) -> None:
        pass

    def settle_outputs(self, n_outputs: int) -> np.ndarray:
        """Row k of the logits holds k everywhere: a slot can tell which row it was given."""
        return np.repeat(np.arange(n_outputs, dtype=np.float32)[:, None], 4, axis=1)


def decode_together(gate: DecodeGate, parts: list[BatchPart]) -> dict[int, BaseException]:
    """Every part's slot takes part, then each asks for its decode on a thread of its own; the
    errors raised, by slot."""
    errors: dict[int, BaseException] = {}
    for part in parts:
        gate.join(part.seq)

    def one(part: BatchPart) -> None:
        try:
            gate.decode(part, stop=lambda: False)
        except Exception as exc:
            errors[part.seq] = exc
        gate.leave(part.seq)

    threads = [threading.Thread(target=one, args=(p,)) for p in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    return errors


def tokens(seq: int, n: int, start: int = 0) -> BatchPart:
    return BatchPart(seq, [1] * n, start)


def test_every_members_decode_goes_into_one_batch():
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    decode_together(gate, [tokens(0, 1), tokens(1, 100), tokens(2, 1)])
    assert len(runtime.batches) == 1 and sorted(runtime.batches[0]) == [(0, 1), (1, 100), (2, 1)]
    assert gate.stats.most_parts == 3 and gate.members == 0
    assert runtime.timed == []  # a shared step says nothing about one token's time
    gate.decode(tokens(0, 1))
    assert len(runtime.timed) == 1


def test_a_batch_goes_to_llama_cpp_in_sequence_order_and_each_slot_reads_its_own_row():
    """llama.cpp makes one micro-batch of split streams' tokens only when their sequence ids come
    in order (in the order the slots asked, a step of 4 tokens took 30.6 ms against 22.0)."""
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    rows: dict[int, int] = {}
    parts = [tokens(3, 1), tokens(1, 5), tokens(2, 1), tokens(0, 2)]
    for part in parts:
        gate.join(part.seq)

    outputs: dict[int, float] = {}

    def one(part: BatchPart) -> None:
        rows[part.seq], logits = gate.decode(part)
        outputs[part.seq] = float(logits[0][0])
        gate.leave(part.seq)

    threads = [threading.Thread(target=one, args=(p,)) for p in parts]
    for thread in threads:  # they ask in this order: 3, 1, 2, 0
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join(10)
    assert runtime.batches == [[(0, 2), (1, 5), (2, 1), (3, 1)]]
    assert rows == {0: 0, 1: 2, 2: 7, 3: 8}  # each part's first token in the batch
    assert outputs == {0: 0, 1: 1, 2: 2, 3: 3}  # and its own row of the batch's outputs


def test_a_slot_that_leaves_no_longer_holds_the_others_up():
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    ready = threading.Barrier(2)
    done = threading.Event()

    def member(seq: int) -> None:
        gate.decode(tokens(seq, 1))
        ready.wait()
        if seq == 0:
            gate.decode(tokens(0, 1, 1))
            done.set()

    threads = [threading.Thread(target=member, args=(s,)) for s in (0, 1)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert not done.is_set()  # slot 1 takes part and has not asked yet: slot 0 waits
    gate.leave(1)
    assert done.wait(5)
    gate.leave(0)
    for thread in threads:
        thread.join(5)


def test_parts_beyond_n_batch_wait_for_the_next_step():
    runtime = FakeRuntime(n_batch=130)
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    decode_together(gate, [tokens(0, 128), tokens(1, 128)])
    assert runtime.batches in ([[(0, 128)], [(1, 128)]], [[(1, 128)], [(0, 128)]])


def test_a_part_alone_without_cells_fails_with_kvfull():
    runtime = FakeRuntime(full=1)
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    with pytest.raises(KVFull):
        gate.decode(tokens(0, 10))
    assert gate.stats.failed_full == 1
    gate.decode(tokens(0, 10))  # the gate goes on
    assert runtime.batches == [[(0, 10)]]


def test_without_cells_the_largest_part_fails_and_the_others_run():
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    original = runtime.decode_parts

    def full_when_shared(parts, abortable=False):
        if len(parts) > 1:
            raise KVFull("full")
        return original(parts, abortable)

    runtime.decode_parts = full_when_shared  # type: ignore[method-assign]
    errors = decode_together(gate, [tokens(0, 50), tokens(1, 1)])
    assert list(errors) == [0] and runtime.batches == [[(1, 1)]]  # the prefill failed, not the stream


def test_a_prefill_alone_in_its_batch_is_abortable_a_shared_one_is_not():
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    gate.decode(tokens(0, 8), stop=lambda: False)
    assert runtime.armed == [True]
    gate.leave(0)
    runtime.armed.clear()
    decode_together(gate, [tokens(0, 8), tokens(1, 1)])
    assert runtime.armed == [False]


def record(role: str, tokens: list[int], content: str = "", text: str = "") -> CachedMessage:
    content = content or role
    return CachedMessage(role=role, content=content, text=text or f"<{role}>{content}", tokens=tokens)


def chat(messages: list[dict]) -> ChatPrompt:
    """``messages`` rendered as ``record`` writes them, then the reply's header."""
    return ChatPrompt(messages, "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<a>")


def slot(seq: int, records: list[CachedMessage], last_used: float = 0.0) -> SlotState:
    n = sum(len(r.tokens) for r in records)
    return SlotState(seq, StateView(records, n), last_used)


def test_a_request_takes_the_slot_holding_its_conversation():
    mine = [record("system", [1, 2, 3], "be brief"), record("user", [4, 5], "hi")]
    other = [record("system", [1, 2, 3], "be brief"), record("user", [6, 7], "bye")]
    wanted = chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}])
    chosen = choose_slot([slot(0, other, 5.0), slot(1, mine, 1.0), slot(2, [], 0.0)], wanted)
    assert chosen.seq == 1


def test_with_nothing_shared_an_empty_slot_then_the_least_recently_used():
    held = [record("user", [4, 5], "hi")]
    wanted = chat([{"role": "user", "content": "something else"}])
    assert choose_slot([slot(0, held, 1.0), slot(1, [], 0.0)], wanted).seq == 1
    assert choose_slot([slot(0, held, 9.0), slot(1, held, 2.0)], wanted).seq == 1


def test_a_prompt_given_as_tokens_takes_the_slot_sharing_its_prefix():
    typed = RawPrompt(tokens=(1, 2, 3, 4, 9))
    assert choose_slot([slot(0, [record("prompt", [1, 2, 7])], 9.0),
                        slot(1, [record("prompt", [1, 2, 3, 4])], 1.0)], typed).seq == 1


def test_a_slot_holding_the_question_rendered_another_way_is_not_its_conversation():
    # Asked before with tools offered: the template wrote them ahead of the question.
    offered = [record("user", list(range(40)), "name a colour", text="<tools>...<user>name a colour")]
    wanted = chat([{"role": "user", "content": "name a colour"}])
    assert choose_slot([slot(0, offered, 1.0), slot(1, [], 0.0)], wanted).seq == 1  # the empty one
    plain = [record("user", list(range(50, 60)), "name a colour")]
    assert choose_slot([slot(0, offered, 1.0), slot(1, [], 0.0), slot(2, plain, 0.5)], wanted).seq == 2


def test_no_idle_slot_is_a_bug_not_a_choice():
    with pytest.raises(ValueError):
        choose_slot([], chat([]))


def test_the_gates_lock_is_granted_in_the_order_asked_and_a_holder_cannot_jump_the_queue():
    from localchat.engine.slots.gate import FairLock

    lock = FairLock()
    order: list[str] = []
    asked = threading.Event()

    def later(name: str) -> None:
        with lock:
            order.append(name)

    with lock:
        with lock:  # reentrant
            order.append("holder")
        waiter = threading.Thread(target=later, args=("waiter",))
        waiter.start()
        time.sleep(0.2)
        asked.set()
    with lock:  # asked again at once: the waiter asked first
        order.append("holder again")
    waiter.join(5)
    assert order == ["holder", "waiter", "holder again"]


def test_work_that_decodes_by_itself_runs_as_a_step_of_its_own():
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    for seq in (0, 1):
        gate.join(seq)
    steps: list[str] = []
    runtime_decode = runtime.decode_parts

    def decode(parts, abortable=False):
        steps.append("batch")
        return runtime_decode(parts, abortable)

    runtime.decode_parts = decode  # type: ignore[method-assign]

    def slot0() -> None:
        gate.decode(tokens(0, 1))
        gate.leave(0)

    def slot1() -> None:
        gate.run_alone(1, lambda: steps.append("image"))
        gate.decode(tokens(1, 1))
        gate.leave(1)

    threads = [threading.Thread(target=slot0), threading.Thread(target=slot1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert "image" in steps and steps.count("batch") >= 1
    assert all(len(batch) <= 2 for batch in runtime.batches)  # the image was in no batch

    with pytest.raises(ValueError):  # what the work raised reaches the slot that asked
        gate.run_alone(0, lambda: (_ for _ in ()).throw(ValueError("bad image")))


def stepper(seq: int, n: int, seen: list[tuple[int, float]]) -> object:
    """A reply stepped ``n`` tokens on: each step notes which row of logits it was given."""
    left = [n]

    def step(request) -> BatchPart | None:
        assert request.error is None and request.logits is not None
        seen.append((seq, float(request.logits[0][0])))
        left[0] -= 1
        return tokens(seq, 1, n - left[0]) if left[0] else None

    return step


def test_a_stepped_reply_goes_on_in_each_batch_without_its_thread():
    """Each next part of a stepped reply joins the next batch with the other members' parts,
    its step reading its own row of the batch's logits; a member's prefill on its own thread
    joins the same batches."""
    runtime = FakeRuntime()
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    seen: list[tuple[int, float]] = []
    for seq in (0, 1):
        gate.join(seq)

    def streaming() -> None:
        gate.run_steps(tokens(1, 1), stepper(1, 3, seen))
        gate.leave(1)

    thread = threading.Thread(target=streaming)
    thread.start()
    time.sleep(0.1)
    assert runtime.batches == []  # slot 0 takes part: the batch waits for its part
    gate.decode(tokens(0, 8))
    gate.leave(0)
    thread.join(5)
    assert runtime.batches == [[(0, 8), (1, 1)], [(1, 1)], [(1, 1)]]
    assert seen == [(1, 1.0), (1, 0.0), (1, 0.0)]  # after slot 0's output, its own; then alone
    assert gate.members == 0


def test_a_stepped_reply_hears_the_error_of_its_decode_and_its_own_error_reaches_its_slot():
    runtime = FakeRuntime(full=1)
    gate = DecodeGate(runtime)  # type: ignore[arg-type]
    heard: list[BaseException | None] = []

    def step(request) -> BatchPart | None:
        heard.append(request.error)
        request.error = None  # it handles the decode's error and goes on
        if len(heard) == 1:
            return tokens(0, 1, 1)
        raise ValueError("the reply broke")

    with pytest.raises(ValueError, match="the reply broke"):
        gate.run_steps(tokens(0, 1), step)
    assert isinstance(heard[0], KVFull) and heard[1] is None
    assert runtime.batches == [[(0, 1)]]


def test_on_the_engine_thread_each_step_is_a_job_of_its_own_so_other_work_runs_between():
    """An embedding queued for the engine thread while a reply streams runs after the next
    step, not after the reply."""
    import queue

    runtime = FakeRuntime()
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    gate = DecodeGate(runtime, jobs.put)  # type: ignore[arg-type]
    order: list[str] = []
    original = runtime.decode_parts

    def decode(parts, abortable=False):
        order.append("step")
        if len(order) == 1:
            jobs.put(lambda: order.append("embedding"))
        return original(parts, abortable)

    runtime.decode_parts = decode  # type: ignore[method-assign]

    def engine() -> None:
        while (job := jobs.get()) is not None:
            job()

    worker = threading.Thread(target=engine)
    worker.start()
    gate.run_steps(tokens(0, 1), stepper(0, 3, []))
    jobs.put(None)
    worker.join(5)
    assert order == ["step", "embedding", "step", "step"]


def test_steps_the_engine_thread_will_never_run_fail_with_a_clear_error():
    runtime = FakeRuntime()

    def closed(job) -> None:
        raise EngineError("the model was closed")

    gate = DecodeGate(runtime, closed)  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="closed"):
        gate.run_steps(tokens(0, 1), stepper(0, 3, []))
    assert runtime.batches == []
