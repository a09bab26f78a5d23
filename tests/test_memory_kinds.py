"""Models whose memory cannot drop cells: recurrent (Mamba) and hybrid (LFM2: attention plus
short convolutions), on small random-weight GGUFs in real shapes (scripts/synth-gguf).

llama.cpp cannot remove the end of a recurrent state, so the engine keeps checkpoints at turn
boundaries and rolls back to them (a stopped prefill, /retry), and a trim means prefilling the
kept turns again (done in the background by the keeper). The oracle is the same as for the KV
cache: a greedy reply after any of that equals the reply of a fresh prefill.
"""

from __future__ import annotations

import pytest
from oracle import (
    GREEDY,
    assert_matches_fresh,
    loaded_engine,
    reply_tokens,
    take_back_last_exchange,
)

from localchat.context.chat_context import ChatContext
from localchat.context.factory import open_chat
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Done, Failed, Notice, PrefillProgress
from localchat.settings import ContextSection, Settings

SYSTEM = "You are a helpful assistant."


def test_each_memory_kind_is_named_at_load(synthetic_model, engine):
    from localchat.models.gguf import read_gguf

    assert engine.info.memory == "kv" and engine.can_trim_in_place
    for shape, kind in [("mamba-tiny", "recurrent"), ("lfm2-tiny", "hybrid"), ("gemma3-tiny", "swa")]:
        path = synthetic_model(shape)
        assert read_gguf(path).memory_kind == kind  # what doctor shows without loading
        with loaded_engine(path, 512, shape, speculative="auto") as e:
            assert e.info.memory == kind == e.memory_kind
            assert not e.can_trim_in_place  # window-size caches by default: checkpoints
            # Rejected drafts cannot be dropped either: asked for, speculation is off, and why.
            assert e.info.speculative.startswith("off: ") and "cannot drop" in e.info.speculative
            events = list(e.submit([{"role": "user", "content": "Hi"}],
                                   Sampling(temperature=0, max_tokens=2)))
            assert [n.message for n in events if isinstance(n, Notice)] == [
                "speculative decoding is " + e.info.speculative]
    # Full-size sliding-window caches can drop turns like any KV cache.
    with loaded_engine(synthetic_model("gemma3-tiny"), 512, "full", swa_full=True,
                       speculative="auto") as e:
        assert e.memory_kind == "swa" and e.can_trim_in_place
        assert e.info.speculative == "ngram"


@pytest.fixture(scope="module", params=["mamba-tiny", "lfm2-tiny", "gemma3-tiny"])
def stateful(request, synthetic_model):
    """(engine, oracle engine) on a recurrent, a hybrid, and a sliding-window model whose cache
    keeps only the window (swa_full off, the default: a 128-token window, so rolling back past it
    needs a checkpoint)."""
    path = synthetic_model(request.param)
    with loaded_engine(path, 1024, request.param) as engine, \
            loaded_engine(path, 1024, "oracle", speculative="off") as oracle:
        assert not engine.can_trim_in_place
        yield engine, oracle


def exact(chat: ChatContext, oracle: Engine, text: str) -> Done:
    tokens, done = reply_tokens(chat.send(text))
    assert_matches_fresh(tokens, oracle, chat.last_sent)
    return done


def test_multi_turn_chat_appends_without_rolling_back(stateful):
    engine, oracle = stateful
    engine.reset()
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    previous = None
    for text in ["Name three colors.", "Which one is the warmest?", "And the coldest?"]:
        done = exact(chat, oracle, text)
        assert done.timings.rebuild_n == 0
        if previous is not None:
            assert done.timings.cache_n == previous.timings.n_ctx_used
        previous = done


def test_retry_rolls_back_to_the_checkpoint_before_the_last_prompt_token(stateful):
    engine, oracle = stateful
    engine.reset()
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    exact(chat, oracle, "Name a planet.")
    first = exact(chat, oracle, "Tell me about it.")
    prompt_n = first.timings.cache_n + first.timings.prompt_n
    text = take_back_last_exchange(chat)
    again = exact(chat, oracle, text)
    # Everything but the last prompt token comes from the checkpoint: nothing is prefilled twice.
    assert again.timings.cache_n == prompt_n - 1 and again.timings.rebuild_n == 0


def test_a_stopped_prefill_rolls_back_and_the_next_turn_is_exact(stateful):
    engine, oracle = stateful
    engine.reset()
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    held = exact(chat, oracle, "Hello!").timings.n_ctx_used
    handle = chat.send(" ".join(f"word{i % 50}" for i in range(200)))
    for event in handle:
        if isinstance(event, PrefillProgress) and event.done >= 128:
            handle.stop()
    assert handle.result.finish_reason == "aborted"
    assert engine.tokens_in_context == held  # back at the checkpoint where the turn started
    done = exact(chat, oracle, "Just say hi.")
    assert done.timings.cache_n >= held - 1


def test_an_edit_of_an_earlier_turn_prefills_from_the_nearest_checkpoint(stateful):
    engine, oracle = stateful
    engine.reset()
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    for text in ["Name a fruit.", "Name a color.", "Name an animal."]:
        exact(chat, oracle, text)
    # Forget the last two exchanges and ask something else: the cache must roll back into the
    # middle of the conversation, which only a checkpoint allows.
    take_back_last_exchange(chat)
    take_back_last_exchange(chat)
    done = exact(chat, oracle, "Name a city.")
    assert done.timings.cache_n > 0


def test_conversations_interleaved_through_a_state_pool_stay_exact(stateful):
    """What ``localchat serve`` does: each turn takes the saved state that keeps the most of its
    messages; for these memories a saved state carries its checkpoints, so an edit inside one
    rolls back to them instead of prefilling from zero."""
    from localchat.engine.state_pool import StatePool

    engine, oracle = stateful
    engine.reset()
    pool = StatePool(256 * 1024**2)
    conversations = [[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": f"Tell me about {topic}."}]
                     for topic in ("rivers", "stars")]
    for turn in range(2):
        for messages in conversations:
            tokens, done = reply_tokens(engine.submit(messages, GREEDY, pool=pool))
            assert_matches_fresh(tokens, oracle, messages)
            if turn:  # its own state came back: only the new message was prefilled
                assert done.timings.restore_ms > 0 and done.timings.prompt_n < 40
            messages += [{"role": "assistant", "content": done.reply},
                         {"role": "user", "content": "And then?"}]
    edited = conversations[0][:3] + [{"role": "user", "content": "Something else."}]
    tokens, done = reply_tokens(engine.submit(edited, GREEDY, pool=pool))
    assert_matches_fresh(tokens, oracle, edited)
    assert done.timings.cache_n > 0  # rolled back to a checkpoint of the saved state


@pytest.mark.parametrize("shape", ["mamba-tiny", "lfm2-tiny", "gemma3-tiny"])
def test_a_thirty_turn_chat_at_n_ctx_512_trims_by_rebuilding_and_stays_exact(synthetic_model, shape):
    path = synthetic_model(shape)
    with loaded_engine(path, 512, "mamba") as engine, loaded_engine(path, 512, "oracle", speculative="off") as oracle:
        config = Settings(context=ContextSection(summarize=False))
        chat = open_chat(engine, config, system="You are brief.",
                         sampling=Sampling(temperature=0, repeat_penalty=1.0, max_tokens=24))
        rebuilt_ahead = 0
        for n in range(30):
            engine.wait_idle(timeout=60)
            handle = chat.send(f"Tell me one fact about the number {n}, in one sentence.")
            tokens, done = [], None
            for event in handle:
                assert not isinstance(event, Failed), event.message
                done = event
            t = done.timings
            assert t.n_ctx_used <= 512 and t.approx_n == 0 and not t.context_shift
            # The kept turns were prefilled again before this message came: it paid nothing.
            assert t.rebuild_n == 0
            rebuilt_ahead += t.rebuild_background_n > 0
        assert chat.first_visible > 0  # old turns left the window
        assert rebuilt_ahead  # and the kept ones were prefilled again before a message waited
        engine.wait_idle(timeout=60)
        tokens, done = reply_tokens(chat.send("Say one more number."))
        assert_matches_fresh(tokens, oracle, chat.last_sent)


@pytest.mark.parametrize("shape,options", [
    (None, {}), ("gemma3-tiny", {}), ("gemma3-tiny", {"swa_full": True}), ("lfm2-tiny", {}),
])
def test_the_kv_estimate_matches_what_llama_cpp_allocates(synthetic_model, test_model_path, shape, options):
    """The offload estimator's weights and KV cache against llama.cpp's own buffer sizes (its
    load log): windowed caches and a hybrid's attention-free layers included."""
    from localchat.engine.offload import graph_reserve_bytes
    from localchat.engine.runtime import LlamaRuntime
    from localchat.models.gguf import read_gguf

    path = synthetic_model(shape) if shape else test_model_path
    opts = EngineOptions(n_ctx=2048, gpu_layers=0, **options)
    gguf = read_gguf(path)
    runtime = LlamaRuntime(path, opts, 0)
    try:
        mib = 2 ** 20
        kv = gguf.kv_cache_bytes(2048, swa_full=opts.swa_full, n_ubatch=opts.n_ubatch) / mib
        assert kv == pytest.approx(sum(runtime.buffer_mib["kv"].values()), rel=0.02)
        weights = (sum(gguf.layer_bytes.values()) + gguf.non_layer_bytes) / mib
        assert weights == pytest.approx(runtime.buffer_mib["model"]["CPU_Mapped"], rel=0.05)
        # The graph reserve is an upper bound of the compute buffer.
        assert graph_reserve_bytes(gguf, opts.n_ubatch, 2048) / mib >= sum(runtime.buffer_mib["compute"].values())
    finally:
        runtime.close()
