"""The engine on the real test model: exact KV reuse, stopping, and what it reports."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from localchat.context.chat_context import ChatContext
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.errors import EngineError
from localchat.events import Done, Failed, PrefillProgress, Token

SYSTEM = "You are a helpful assistant."


def finish(handle) -> Done:
    final = None
    for event in handle:
        final = event
    assert isinstance(final, Done), final
    return final


def kv_length(engine: Engine) -> int:
    return engine.call(lambda: engine._runtime.max_position() + 1)


def test_second_turn_prefills_only_new_tokens(engine, greedy):
    chat = ChatContext(engine, system=SYSTEM, sampling=greedy)
    first = finish(chat.send("Name three colors."))
    second = finish(chat.send("Which one is the warmest?"))
    runtime = engine._runtime
    new_text = "<|im_end|>\n<|im_start|>user\nWhich one is the warmest?<|im_end|>\n<|im_start|>assistant\n"
    assert second.timings.cache_n == first.timings.n_ctx_used
    # A reply cut by max_tokens leaves its last sampled token unevaluated: the next turn adds it.
    unevaluated = 1 if first.finish_reason == "length" else 0
    assert second.timings.prompt_n == len(runtime.tokenize(new_text, False)) + unevaluated
    assert not second.timings.prefix_fallback
    assert kv_length(engine) == engine.tokens_in_context == second.timings.n_ctx_used


def test_reply_tokens_are_reused_exactly_over_many_turns(engine, greedy):
    chat = ChatContext(engine, system=SYSTEM, sampling=greedy)
    previous = None
    for question in ["Hi!", "What is 2+2?", "And 3+3?", "Thanks, bye."]:
        done = finish(chat.send(question))
        if previous is not None:
            assert done.timings.cache_n == previous.timings.n_ctx_used
        previous = done
    assert kv_length(engine) == engine.tokens_in_context


def test_stop_ends_decoding_within_one_token_and_keeps_the_partial_reply(engine):
    chat = ChatContext(engine, system=SYSTEM, sampling=Sampling(temperature=0, max_tokens=300))
    handle = chat.send("Write a long story about a dragon.")
    tokens_after_stop, seen = 0, 0
    final = None
    for event in handle:
        if isinstance(event, Token):
            seen += 1
            if handle.stop_requested:
                tokens_after_stop += 1
            if seen == 5:
                handle.stop()
        final = event
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert tokens_after_stop <= 1
    assert chat.history[-1].stopped and chat.history[-1].content == final.reply
    assert final.reply


def test_reuse_survives_an_aborted_turn(engine, greedy):
    chat = ChatContext(engine, system=SYSTEM, sampling=Sampling(temperature=0, max_tokens=300))
    handle = chat.send("Write a long story about a dragon.")
    for event in handle:
        if isinstance(event, Token) and not handle.stop_requested:
            handle.stop()
    stopped = handle.result
    assert stopped.finish_reason == "aborted"
    after = finish(chat.send("Make it shorter.", greedy))
    assert after.timings.cache_n == stopped.timings.n_ctx_used
    assert kv_length(engine) == engine.tokens_in_context


def test_stop_during_a_long_prefill_ends_the_turn_and_keeps_the_cache_consistent(engine, greedy):
    chat = ChatContext(engine, system=SYSTEM, sampling=greedy)
    finish(chat.send("Hello"))
    kept = engine.tokens_in_context
    document = " ".join(f"word{i % 50}" for i in range(500))
    handle = chat.send(document)
    progress = []
    for event in handle:
        if isinstance(event, PrefillProgress):
            progress.append(event)
            handle.stop()
    done = handle.result
    assert isinstance(done, Done) and done.finish_reason == "aborted" and done.reply == ""
    assert progress and progress[-1].done < progress[-1].total
    assert kv_length(engine) == engine.tokens_in_context >= kept
    again = finish(chat.send("Just say hi."))
    assert again.timings.cache_n >= kept


def test_stop_requested_before_the_turn_starts_aborts_without_work(engine, greedy):
    blocker = threading.Event()
    engine._jobs.put(blocker.wait)  # hold the engine thread so the turn is still queued
    chat = ChatContext(engine, system=SYSTEM, sampling=greedy)
    handle = chat.send("Hi")
    handle.stop()
    blocker.set()
    done = finish(handle)
    assert done.finish_reason == "aborted" and done.timings.prompt_n == 0


def test_template_that_rewrites_earlier_turns_falls_back_and_reports_it(test_model_path, greedy):
    rewriting = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(earlier answer){% else %}"
        "{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    engine = Engine(test_model_path, EngineOptions(n_ctx=1024, gpu_layers=0, chat_template=rewriting))
    engine.load()
    try:
        chat = ChatContext(engine, system=SYSTEM, sampling=greedy)
        first = finish(chat.send("Name a fruit."))
        assert not first.timings.prefix_fallback
        second = finish(chat.send("Another one?"))
        assert second.timings.prefix_fallback
        assert 0 < second.timings.cache_n < first.timings.n_ctx_used
        assert kv_length(engine) == engine.tokens_in_context
    finally:
        engine.close()


def test_gguf_without_chat_template_fails_with_the_setting_to_add(test_model_path, tmp_path):
    data = test_model_path.read_bytes()
    key = b"tokenizer.chat_template"
    assert data.count(key) == 1
    stripped = tmp_path / "no-template.gguf"
    stripped.write_bytes(data.replace(key, b"tokenizer.chat_templatX"))
    engine = Engine(stripped, EngineOptions(n_ctx=512, gpu_layers=0), name="notemplate")
    try:
        with pytest.raises(EngineError, match='chat_format = "chatml"'):
            engine.load()
    finally:
        engine.close()
    # With the registry's override the same file chats.
    engine = Engine(stripped, EngineOptions(n_ctx=512, gpu_layers=0, chat_format="chatml"))
    try:
        engine.load()
        done = finish(engine.submit([{"role": "user", "content": "Hi"}],
                                    Sampling(temperature=0, max_tokens=4)))
        assert done.timings.predicted_n > 0
    finally:
        engine.close()


def test_prompt_longer_than_the_context_fails_cleanly(test_model_path):
    engine = Engine(test_model_path, EngineOptions(n_ctx=256, gpu_layers=0))
    engine.load()
    try:
        handle = engine.submit([{"role": "user", "content": "word " * 400}], Sampling(max_tokens=4))
        final = list(handle)[-1]
        assert isinstance(final, Failed) and "256" in final.message
        ok = finish(engine.submit([{"role": "user", "content": "Hi"}], Sampling(temperature=0, max_tokens=4)))
        assert ok.finish_reason in ("stop", "length")
    finally:
        engine.close()


def test_work_asked_of_a_closed_engine_fails_at_once_and_work_queued_before_still_runs(test_model_path):
    """A turn that ends as the app quits saves its snapshot after the engine was closed: that
    call, and any turn sent then, must fail at once instead of waiting on a thread that is gone."""
    engine = Engine(test_model_path, EngineOptions(n_ctx=256, gpu_layers=0))  # no model load needed
    running, release = threading.Event(), threading.Event()
    queued_before: list[str] = []
    blocker = threading.Thread(target=lambda: engine.call(lambda: (running.set(), release.wait(10))), daemon=True)
    blocker.start()
    running.wait(10)  # the engine thread is busy: the next call waits in its queue
    caller = threading.Thread(target=lambda: queued_before.append(engine.call(lambda: "ran")), daemon=True)
    caller.start()
    while engine._jobs.qsize() < 1:
        time.sleep(0.001)
    closing = threading.Thread(target=engine.close, daemon=True)
    closing.start()
    results: list[object] = []

    def after_close() -> None:
        while not engine._closed:
            pass
        try:
            engine.export_snapshot()
        except EngineError as exc:
            results.append(str(exc))
        results.append(list(engine.submit([{"role": "user", "content": "Hi"}], Sampling(max_tokens=4))))
        results.append(list(engine.prepare([{"role": "user", "content": "Hi"}])))
        results.append(engine.wait_idle(5))  # a background job refused by a closed engine is not waited on

    late = threading.Thread(target=after_close, daemon=True)
    late.start()
    late.join(10)
    release.set()
    for thread in (blocker, caller, closing):
        thread.join(10)
    assert not late.is_alive(), "a call after close waited for an engine thread that had ended"
    assert results[0] == "the model was closed"
    assert [type(e) for e in results[1]] == [Failed] and results[1][0].message == "the model was closed"
    assert [type(e) for e in results[2]] == [Failed] and results[3] is True
    assert queued_before == ["ran"]


def test_reply_that_fills_the_context_ends_with_length(test_model_path):
    engine = Engine(test_model_path, EngineOptions(n_ctx=128, gpu_layers=0))
    engine.load()
    try:
        done = finish(engine.submit([{"role": "user", "content": "Count from one to one thousand."}],
                                    Sampling(temperature=0, max_tokens=1000, repeat_penalty=1.0)))
        assert done.finish_reason in ("length", "stop")
        assert done.timings.n_ctx_used < 128
    finally:
        engine.close()


def test_timings_are_complete(engine, greedy):
    done = finish(ChatContext(engine, system=SYSTEM, sampling=greedy).send("Say something."))
    t = done.timings
    assert t.prompt_n > 0 and t.prompt_ms > 0 and t.ttft_ms >= t.prompt_ms
    assert t.predicted_n > 1 and t.tpot_ms > 0 and t.itl_p95_ms >= t.itl_p50_ms > 0
    assert t.n_ctx == 2048 and t.n_ctx_used == engine.tokens_in_context


def test_confidence_tracking_reports_token_stats_for_the_first_tokens(test_model_path):
    options = EngineOptions(n_ctx=512, gpu_layers=0, track_confidence=True, confidence_tokens=4)
    engine = Engine(test_model_path, options)
    engine.load()
    try:
        events = list(engine.submit([{"role": "user", "content": "Hi"}], Sampling(temperature=0, max_tokens=8)))
        tokens = [e for e in events if isinstance(e, Token)]
        assert len(tokens) > 4
        for t in tokens[:4]:
            # Greedy picks the top token: its probability is the top-1, the margin is below it.
            assert 0.0 < t.prob <= 1.0 and 0.0 <= t.margin <= t.prob and t.entropy >= 0.0
        # Past the window no token pays the pass over the vocabulary.
        assert all(t.prob is None and t.margin is None and t.entropy is None for t in tokens[4:])
    finally:
        engine.close()


def test_token_stats_match_a_plain_softmax():
    import numpy as np

    from localchat.engine.sampling.confidence import token_stats

    logits = np.array([2.0, 1.0, 0.5, -3.0], dtype=np.float32)
    p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    stats = token_stats(logits, 1)
    assert abs(stats.prob - p[1]) < 1e-6 and abs(stats.margin - (p[0] - p[1])) < 1e-6
    assert abs(stats.entropy - float(-(p * np.log(p)).sum())) < 1e-5


def test_copy_of_model_loads_under_its_own_name(test_model_path, tmp_path):
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(test_model_path, copy)
    engine = Engine(copy, EngineOptions(n_ctx=256, gpu_layers=0))
    try:
        info = engine.load()
        assert info.model == "renamed" and info.backend == "CPU" and info.gpu_layers == 0
    finally:
        engine.close()


def test_sampling_without_vocabulary_passes_picks_what_llama_cpp_s_chain_picks(engine):
    """Greedy with a repeat penalty: the engine's argmax over logits penalised in place equals
    llama.cpp's penalties + greedy sampler chain, token for token."""
    import llama_cpp

    runtime = engine._require_runtime()
    prompt = runtime.tokenize("<|im_start|>user\nCount: one one one one<|im_end|>\n"
                              "<|im_start|>assistant\n", True)

    def run(pick) -> list[int]:
        def job():
            runtime.clear()
            runtime.decode(prompt, 0)
            tokens = []
            for i in range(24):
                tokens.append(pick())
                runtime.decode([tokens[-1]], len(prompt) + i)
            runtime.clear()
            return tokens
        return engine.call(job)

    ours = runtime.new_sampler(Sampling(temperature=0, repeat_penalty=1.5))
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(
        chain, llama_cpp.llama_sampler_init_penalties(runtime.n_vocab, 64, 1.5, 0.0, 0.0))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    plain = runtime.new_sampler(Sampling(temperature=0, repeat_penalty=1.0))
    try:
        expected = run(lambda: int(llama_cpp.llama_sampler_sample(chain, runtime.ctx, -1)))
        assert run(ours.sample) == expected
        assert run(plain.sample) != expected  # the penalty mattered in this reply
    finally:
        ours.close()
        plain.close()
        llama_cpp.llama_sampler_free(chain)
        engine.reset()


def test_frequency_and_presence_penalties_lower_recent_tokens_by_count_as_llama_cpp_does():
    import numpy as np

    from localchat.engine.sampling.sampler import apply_repeat_penalty

    logits = np.array([2.0, -1.0, 3.0, 1.0], dtype=np.float32)
    apply_repeat_penalty(logits, [0, 0, 1], 1.0, frequency=0.5, presence=0.25)
    assert logits.tolist() == [2.0 - 2 * 0.5 - 0.25, -1.0 - 0.5 - 0.25, 3.0, 1.0]

    logits = np.array([2.0, -1.0], dtype=np.float32)
    apply_repeat_penalty(logits, [0, 1, 1], 2.0, frequency=0.5)  # the repeat penalty comes first
    assert logits.tolist() == [2.0 / 2 - 0.5, -1.0 * 2 - 1.0]
