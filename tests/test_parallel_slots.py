"""Parallel slots on the real model (``engine.slots``): conversations decoded together in one
context, each exact (the greedy oracle per slot: a reply equals a fresh prefill of its history,
up to a near-tie flipped by batch shape), each reusing its own cells, each with its own stop and
grammar; a long prompt prefilled in chunks while another slot streams; and each slot with the
whole context of its own."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from oracle import GREEDY, assert_matches_fresh, reply_tokens

from localchat.engine.options import EngineOptions, Sampling
from localchat.engine.slots.parallel import ParallelEngine
from localchat.events import Done, PrefillProgress, Token
from localchat.formats import json_format
from localchat.formats.constraint import Constraint

pytestmark = pytest.mark.model

QUESTIONS = ["What is the capital of France?", "Name three colours.",
             "Write a haiku about rain.", "What is 2+2?"]


@pytest.fixture(scope="module")
def slots(test_model_path):
    engine = ParallelEngine(test_model_path, EngineOptions(n_ctx=2048, gpu_layers=0, parallel=4),
                            name="smollm2-135m")
    engine.load()
    yield engine
    engine.close()


def run_together(engine: ParallelEngine, conversations: list[list[dict]],
                 sampling: Sampling = GREEDY) -> list[tuple[list[int], Done]]:
    results: list = [None] * len(conversations)

    def one(i: int) -> None:
        results[i] = reply_tokens(engine.submit(conversations[i], sampling))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(conversations))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def test_four_conversations_decode_together_each_exact_and_each_reusing_its_own_cells(slots, fresh):
    before = slots.gate_stats.shared
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    first = run_together(slots, conversations)
    assert slots.gate_stats.shared > before and slots.gate_stats.most_parts == 4
    follow_ups = [[*c, {"role": "assistant", "content": done.reply},
                   {"role": "user", "content": "Say it again in other words."}]
                  for c, (_, done) in zip(conversations, first)]
    second = run_together(slots, follow_ups)
    for (tokens, done), messages, (_, earlier) in zip(second, follow_ups, first):
        # Only the new message (and the reply header) is prefilled: the slot kept the rest.
        assert done.timings.cache_n >= earlier.timings.prompt_n + earlier.timings.cache_n
        assert done.timings.prompt_n < 30
        assert_matches_fresh(tokens, fresh, messages)
    for (tokens, _), messages in zip(first, conversations):
        assert_matches_fresh(tokens, fresh, messages)


def test_one_slot_stopped_leaves_the_others_streaming(slots):
    story = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=40)
    handles = [slots.submit([{"role": "user", "content": f"Tell story number {i} about a cat."}],
                            story) for i in range(3)]
    counts = [0, 0, 0]
    finals: list = [None, None, None]

    def read(i: int) -> None:
        for event in handles[i]:
            if isinstance(event, Token):
                counts[i] += 1
                if i == 1 and counts[i] == 3:
                    handles[i].stop()
            finals[i] = event

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert finals[1].finish_reason == "aborted" and counts[1] <= 5
    for i in (0, 2):
        assert finals[i].finish_reason in ("length", "stop")
        assert counts[i] == 40 or finals[i].finish_reason == "stop"


def test_each_slot_keeps_its_own_grammar(slots, fresh):
    shaped = replace(GREEDY, constraint=Constraint(json_format().grammar), max_tokens=40)
    asked = [{"role": "user", "content": "Give me a JSON object describing a cat."}]
    plain = [{"role": "user", "content": "Describe a cat in one sentence."}]
    results: dict[str, tuple[list[int], Done]] = {}

    def one(name: str, messages: list[dict], sampling: Sampling) -> None:
        results[name] = reply_tokens(slots.submit(messages, sampling))

    threads = [threading.Thread(target=one, args=("json", asked, shaped)),
               threading.Thread(target=one, args=("plain", plain, GREEDY))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    reply = results["json"][1].reply
    if results["json"][1].finish_reason == "stop":
        assert isinstance(json.loads(reply), dict)
    else:
        assert reply.lstrip().startswith("{")
    assert not results["plain"][1].reply.lstrip().startswith("{")
    assert_matches_fresh(results["plain"][0], fresh, plain)


def test_a_long_prompt_is_prefilled_in_chunks_while_another_slot_streams(slots):
    stream = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=60)
    long_text = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
    order: list[str] = []
    lock = threading.Lock()
    streaming = slots.submit([{"role": "user", "content": "Count slowly from one to fifty."}],
                             stream)
    started = threading.Event()

    def read_stream() -> None:
        for event in streaming:
            if isinstance(event, Token):
                started.set()
                with lock:
                    order.append("token")

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert started.wait(60)
    long_turn = slots.submit([{"role": "user", "content": long_text + "\nSummarise."}],
                             replace(GREEDY, max_tokens=2))
    for event in long_turn:
        if isinstance(event, PrefillProgress):
            with lock:
                order.append("chunk")
    reader.join(120)
    first, last = order.index("chunk"), len(order) - 1 - order[::-1].index("chunk")
    assert last > first and "token" in order[first:last]  # the stream went on between chunks


def test_each_slot_has_the_whole_context_and_keeps_its_cells(test_model_path, fresh):
    engine = ParallelEngine(test_model_path, EngineOptions(n_ctx=512, gpu_layers=0, parallel=2),
                            name="smollm2-135m")
    engine.load()
    try:
        assert engine.n_ctx == 512  # per slot, as with one: the context holds 2 x 512 cells
        filler = " ".join(f"Fact {i}: water boils at one hundred degrees." for i in range(26))
        conversations = [[{"role": "user", "content": filler + " Which fact is first?"}],
                         [{"role": "user", "content": filler.replace("water", "milk") + " Now?"}]]
        first = run_together(engine, conversations, replace(GREEDY, max_tokens=8))
        assert all(done.timings.prompt_n > 300 for _, done in first)  # 600+ cells in all
        again = [[*c, {"role": "assistant", "content": done.reply},
                  {"role": "user", "content": "Thanks."}] for c, (_, done) in zip(conversations, first)]
        second = run_together(engine, again, replace(GREEDY, max_tokens=8))
        for (tokens, done), (_, earlier), messages in zip(second, first, again):
            assert done.timings.cache_n >= earlier.timings.prompt_n  # each kept its own cells
            assert_matches_fresh(tokens, fresh, messages)
        too_long = [{"role": "user", "content": filler * 3}]
        _, failed = reply_tokens_or_failure(engine.submit(too_long, GREEDY))
        assert "context" in failed.message and "512" in failed.message
    finally:
        engine.close()


def reply_tokens_or_failure(handle):
    events = list(handle)
    return [e.token_id for e in events if isinstance(e, Token)], events[-1]


@pytest.mark.parametrize("shape", ["mamba-tiny", "lfm2-tiny", "gemma3-tiny", "vocab262k"])
def test_slots_on_recurrent_hybrid_windowed_and_large_vocabulary_models(synthetic_model, shape):
    """Each slot's state is its own sequence's: two conversations interleaved on two slots each
    keep their cells (a recurrent state and a window cache per sequence), and each reply is a
    fresh prefill's of its history (the oracle's margins tell a near-tie from a wrong state)."""
    from oracle import loaded_engine

    path = synthetic_model(shape)
    engine = ParallelEngine(path, EngineOptions(n_ctx=512, gpu_layers=0, parallel=2,
                                                speculative="off"), name=shape)
    engine.load()
    try:
        short = replace(GREEDY, max_tokens=6)
        conversations = [[{"role": "user", "content": f"Conversation {i}: tell me about cats."}]
                         for i in range(2)]
        first = run_together(engine, conversations, short)
        again = [[*c, {"role": "assistant", "content": done.reply},
                  {"role": "user", "content": "More."}] for c, (_, done) in zip(conversations, first)]
        second = run_together(engine, again, short)
        for (_, done), (_, earlier) in zip(second, first):
            assert done.finish_reason in ("length", "stop")
            assert done.timings.cache_n >= earlier.timings.prompt_n // 2  # kept (to a checkpoint)
        with loaded_engine(path, 512, "oracle", speculative="off") as oracle:
            for (tokens, _), messages in zip(second, again):
                assert_matches_fresh(tokens, oracle, messages, short)
    finally:
        engine.close()


def test_every_batch_is_computed_on_the_engine_thread(slots, monkeypatch):
    """ggml's OpenMP keeps a team of threads per computing thread; with several alive it sleeps
    between graph nodes (a token took 18 ms instead of 7): the slots' threads only wait."""
    runtime = slots._require_runtime()
    computed_on: set[str] = set()
    decode_parts = runtime.decode_parts

    def recorded(*args, **kwargs):
        computed_on.add(threading.current_thread().name)
        return decode_parts(*args, **kwargs)

    monkeypatch.setattr(runtime, "decode_parts", recorded)
    results = run_together(slots, [[{"role": "user", "content": q}] for q in QUESTIONS[:3]])
    assert all(done.reply for _, done in results)
    assert computed_on == {"localchat-engine"}
