"""Context that never overflows, on the real model at a small n_ctx: trim by KV shift, capped
summaries built in the background, over-long messages, and the user's turn winning."""

from __future__ import annotations

import pytest

from localchat.context.factory import open_chat
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Done, Failed, PrefillProgress, Token
from localchat.settings import ContextSection, Settings

N_CTX = 512


@pytest.fixture(scope="module")
def small_engine(test_model_path):
    engine = Engine(test_model_path, EngineOptions(n_ctx=N_CTX, gpu_layers=0), name="smollm2-135m")
    engine.load()
    yield engine
    engine.close()


def make_chat(engine, **context):
    engine.reset()
    config = Settings(context=ContextSection(**{"summary_max_tokens": 48, **context}))
    return open_chat(engine, config, system="You are brief.",
                     sampling=Sampling(temperature=0, repeat_penalty=1.0, max_tokens=24))


def kv_span(engine):
    """(first, last position in llama.cpp's cache, tokens the engine's record holds), read
    together on the engine thread: background work (a summary going in) may run right after."""
    return engine.call(lambda: (engine._runtime.min_position(), engine._runtime.max_position(),
                                engine._kv.n_tokens))


def assert_cache_matches_record(engine) -> None:
    first, last, recorded = kv_span(engine)
    assert (first, last) == (0, recorded - 1)  # contiguous, and exactly what the record says


def finish(handle):
    final = None
    for event in handle:
        final = event
    return final


QUESTION = "Tell me one more fact about the number {n}, in a single sentence please."


def test_forty_turns_never_overflow_trim_by_shifting_and_fold_capped_summaries(small_engine):
    chat = make_chat(small_engine)
    trims, summaries = [], []
    for n in range(40):
        small_engine.wait_idle(timeout=60)  # a user takes time to type: summaries get built
        done = finish(chat.send(QUESTION.format(n=n)))
        assert isinstance(done, Done), done
        t = done.timings
        assert t.n_ctx_used <= N_CTX
        assert_cache_matches_record(small_engine)
        if t.trimmed_n:
            trims.append(t)
            # By shifting in this turn, or by a summary that went in (and was prefilled) in the
            # background while the user typed: either way the turn prefills only its message.
            assert t.context_shift or t.summary_n
            assert t.prompt_n <= 60 + 8
        if t.summary_n:
            summaries.append(t.summary_n)
    assert len(trims) >= 2
    assert len(chat.history) == 80  # trimming changes what the model sees, not the history
    assert chat.first_visible > 0
    assert chat.summary and summaries and max(summaries) <= 48
    assert small_engine.count_tokens(chat.summary) <= 48
    assert chat.model_messages()[1]["content"].startswith("Summary of our earlier conversation")


def test_without_summaries_trimming_just_drops_turns(small_engine):
    chat = make_chat(small_engine, summarize=False)
    for n in range(22):
        done = finish(chat.send(QUESTION.format(n=n)))
        assert isinstance(done, Done)
    assert chat.summary == "" and chat.first_visible > 0


def test_overlong_message_is_refused_with_the_numbers(small_engine):
    chat = make_chat(small_engine)
    final = finish(chat.send("lorem ipsum " * 400))
    assert isinstance(final, Failed)
    assert "Message too long" in final.message and f"{N_CTX}" in final.message
    assert chat.history == []


def test_overlong_message_keeps_head_and_tail_with_a_visible_marker(small_engine):
    chat = make_chat(small_engine, overlong="head_tail")
    text = "START " + "lorem ipsum " * 400 + " END?"
    done = finish(chat.send(text))
    assert isinstance(done, Done)
    sent = chat.history[0].content
    assert sent.startswith("START") and sent.rstrip().endswith("END?")
    assert "tokens cut" in sent
    assert done.timings.n_ctx_used <= N_CTX


def test_a_user_message_during_summarization_is_answered_first(small_engine):
    chat = make_chat(small_engine, summarize_threshold=0.3)
    while True:  # fill the context until a background summary starts
        done = finish(chat.send(QUESTION.format(n=len(chat.history))))
        assert isinstance(done, Done)
        if chat.keeper.in_flight is not None:
            break
        assert len(chat.history) < 60
    handle = chat.send("What is 2 + 2?")
    first_token = next(e for e in handle if isinstance(e, Token))
    assert first_token is not None
    done = finish(handle)
    assert isinstance(done, Done) and done.reply
    small_engine.wait_idle(timeout=60)
    assert chat.keeper.in_flight is None  # the summary was stopped and can be asked for again
    assert_cache_matches_record(small_engine)


def build_turns(engine, n):
    chat = make_chat(engine, summarize=False)
    for i in range(n):
        finish(chat.send(QUESTION.format(n=i)))
    return chat


def test_background_prepare_puts_a_summary_in_by_prefilling_after_the_system_prompt(small_engine):
    chat = build_turns(small_engine, 4)
    system_tokens = len(small_engine.cached_messages()[0].tokens)
    messages = chat.model_messages(summary="They asked about numbers 0 and 1.", first_visible=4)
    done = finish(small_engine.prepare(messages))
    assert isinstance(done, Done) and done.finish_reason == "stop"
    # Nothing was inserted before cached cells: all after the system prompt was prefilled again.
    # (the next message's header tokens, equal and exact, are reused too).
    assert system_tokens <= done.timings.cache_n < system_tokens + 8
    assert done.timings.approx_n == 0
    assert_cache_matches_record(small_engine)
    prepared = small_engine.tokens_in_context
    # The next turn over the new window reuses all of it.
    chat.summary, chat.first_visible = "They asked about numbers 0 and 1.", 4
    after = finish(chat.send("And the number 9?"))
    assert after.timings.cache_n >= prepared - 1 and after.timings.prompt_n < 40


def test_a_user_turn_preempts_a_prepare_and_the_cache_is_unchanged(small_engine):
    import threading

    chat = build_turns(small_engine, 4)
    before = small_engine.cached_messages()
    gate = threading.Event()
    small_engine._jobs.put(gate.wait)  # keep the prepare queued behind this
    pending = small_engine.prepare(chat.model_messages(summary="short", first_visible=4))
    turn = chat.send("Next question?")  # a user turn stops pending background work
    gate.set()
    assert finish(pending).finish_reason == "aborted"
    done = finish(turn)
    assert done.timings.cache_n >= sum(len(m.tokens) for m in before) - 1
    assert_cache_matches_record(small_engine)


def test_a_prepare_stopped_mid_way_keeps_what_it_prefilled_for_the_turn(small_engine):
    chat = build_turns(small_engine, 4)
    chat.summary, chat.first_visible = "They asked about numbers 0 and 1. " * 6, 4
    handle = small_engine.prepare(chat.model_messages())
    for event in handle:
        if isinstance(event, PrefillProgress):
            handle.stop()
    done = handle.result
    assert done.finish_reason == "aborted"
    kept = small_engine.tokens_in_context
    assert kv_span(small_engine) == (0, kept - 1, kept)
    after = finish(chat.send("And the number 9?"))
    assert after.timings.cache_n >= kept - 1 and after.timings.approx_n == 0
