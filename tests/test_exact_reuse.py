"""KV reuse that is never wrong, on the real model with greedy decoding.

The oracle: a reply that reuses the KV cache must equal, token for token, the reply of a fresh
engine that prefills the same visible history from nothing. The one allowed exception is a turn
that runs on cells a trim shift moved (``timings.approx_n > 0``): the named approximation, which
only the conversation that made it may use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
from localchat.engine.options import Sampling
from localchat.engine.snapshot_file import SnapshotStore
from localchat.events import Done, PrefillProgress, Token
from localchat.settings import ContextSection, Settings

SYSTEM = "You are a helpful assistant."
PIRATE = "You are a pirate. Always answer like a pirate."


def assert_exact(chat: ChatContext, oracle: Engine, text: str) -> Done:
    """Send ``text``; its greedy reply must equal a fresh prefill's of what the model was shown."""
    tokens, done = reply_tokens(chat.send(text))
    assert done.timings.approx_n == 0
    assert_matches_fresh(tokens, oracle, chat.last_sent)
    return done


def new_session_is_exact(engine: Engine, oracle: Engine) -> Done:
    return assert_exact(ChatContext(engine, sampling=GREEDY), oracle, "List three fruits.")


def test_plain_multi_turn_chat_is_exact_and_reuses_everything(engine, fresh):
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    previous = None
    for text in ["Name three colors.", "Which one is the warmest?", "And the coldest?", "Thanks!"]:
        done = assert_exact(chat, fresh, text)
        if previous is not None:
            assert done.timings.cache_n == previous.timings.n_ctx_used
        previous = done
    new_session_is_exact(engine, fresh)


@pytest.mark.parametrize("wait_for_background", [True, False], ids=["waits", "types-at-once"])
def test_system_prompt_changed_mid_session_is_prefilled_not_rotated(engine, fresh, wait_for_background):
    chat = ChatContext(engine, sampling=GREEDY)
    assert_exact(chat, fresh, "List three fruits.")
    chat.set_system(PIRATE)  # starts the re-prefill in the background
    if wait_for_background:
        assert engine.wait_idle(timeout=60)
    done = assert_exact(chat, fresh, "What is your favourite food?")
    if wait_for_background:  # the background work left only the new message to prefill
        assert done.timings.prompt_n < 30
    assert_exact(chat, fresh, "Why?")
    new_session_is_exact(engine, fresh)


def test_a_new_session_after_a_system_prompt_set_first_is_exact(engine, fresh):
    chat = ChatContext(engine, system=PIRATE, sampling=GREEDY)
    assert_exact(chat, fresh, "What is your favourite food?")
    new_session_is_exact(engine, fresh)


def test_retry_is_exact(engine, fresh):
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    assert_exact(chat, fresh, "Name a planet.")
    assert_exact(chat, fresh, "Tell me about it.")
    text = take_back_last_exchange(chat)
    done = assert_exact(chat, fresh, text)
    assert done.timings.cache_n > 0
    new_session_is_exact(engine, fresh)


def test_a_prefill_stopped_half_way_then_the_next_turn_is_exact(engine, fresh):
    chat = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    assert_exact(chat, fresh, "Hello!")
    handle = chat.send(" ".join(f"word{i % 50}" for i in range(300)))
    for event in handle:
        if isinstance(event, PrefillProgress):
            handle.stop()
    assert handle.result.finish_reason == "aborted"
    assert_exact(chat, fresh, "Just say hi.")
    new_session_is_exact(engine, fresh)


def test_a_reply_stopped_half_way_then_the_next_turn_is_exact(engine, fresh):
    chat = ChatContext(engine, system=SYSTEM, sampling=Sampling(temperature=0, repeat_penalty=1.0,
                                                                max_tokens=200))
    handle = chat.send("Write a long story about a dragon.")
    seen = 0
    for event in handle:
        if isinstance(event, Token):
            seen += 1
            if seen == 8:
                handle.stop()
    assert handle.result.finish_reason == "aborted" and chat.history[-1].stopped
    chat.sampling = GREEDY
    assert_exact(chat, fresh, "Make it shorter.")
    new_session_is_exact(engine, fresh)


def test_switching_sessions_inside_one_engine_is_exact(engine, fresh):
    a = ChatContext(engine, system=SYSTEM, sampling=GREEDY)
    b = ChatContext(engine, system=PIRATE, sampling=GREEDY)
    assert_exact(a, fresh, "Name three colors.")
    assert_exact(b, fresh, "Name three colors.")
    assert_exact(a, fresh, "Which one is the warmest?")
    assert_exact(b, fresh, "Which one is the warmest?")
    new_session_is_exact(engine, fresh)


N_CTX_SMALL = 512


@pytest.fixture(scope="module")
def small(test_model_path):
    with loaded_engine(test_model_path, N_CTX_SMALL, "small") as engine:
        yield engine


@pytest.fixture(scope="module")
def small_fresh(test_model_path):
    with loaded_engine(test_model_path, N_CTX_SMALL, "oracle", speculative="off") as engine:
        yield engine


def test_trimming_with_a_summary_keeps_new_sessions_exact(small, small_fresh):
    config = Settings(context=ContextSection(summary_max_tokens=48))
    chat = open_chat(small, config, system="You are brief.", sampling=GREEDY)
    shifted = summarized = exact_after_install = 0
    for n in range(30):
        if summarized and exact_after_install and shifted:
            break
        small.wait_idle(timeout=60)
        tokens, done = reply_tokens(chat.send(f"Tell me one fact about the number {n}, in one sentence."))
        t = done.timings
        assert t.n_ctx_used <= N_CTX_SMALL
        shifted += t.approx_n > 0
        summarized += bool(chat.summary)
        if t.approx_n == 0:
            # Cells computed in order (also right after a summary went in): exact.
            assert_matches_fresh(tokens, small_fresh, chat.last_sent)
            exact_after_install += bool(chat.summary)
        else:
            # The named approximation: shifted cells, used by this conversation only.
            assert t.context_shift or t.cache_n > 0
    assert summarized and exact_after_install and shifted
    # A new session after all that reuses no shifted cell and answers exactly.
    small.wait_idle(timeout=60)
    tokens, done = reply_tokens(ChatContext(small, sampling=GREEDY).send("List three fruits."))
    assert done.timings.approx_n == 0
    assert_matches_fresh(tokens, small_fresh, [{"role": "user", "content": "List three fruits."}])


def test_a_shift_makes_the_moved_cells_approximate_and_only_their_conversation_reuses_them(
        small, tmp_path):
    config = Settings(context=ContextSection(summarize=False))
    small.reset()
    chat = open_chat(small, config, system="You are brief.", sampling=GREEDY)
    while True:
        _, done = reply_tokens(chat.send(f"Tell me one fact about the number {len(chat.history)}."))
        if done.timings.trimmed_n:
            break
        assert len(chat.history) < 60
    assert done.timings.context_shift and done.timings.approx_n > 0
    system_cells = small.call(lambda: small._kv.exact_n)
    assert 0 < system_cells < small.tokens_in_context
    # The same conversation goes on over its shifted cells...
    _, more = reply_tokens(chat.send("One more, please."))
    assert more.timings.cache_n >= done.timings.n_ctx_used - 1
    # A snapshot keeps the record of which cells are exact.
    store = SnapshotStore(tmp_path)
    store.save("s", {}, small.export_snapshot())
    exact_n = small.call(lambda: small._kv.exact_n)
    small.reset()
    small.import_snapshot(store.load("s", {}).snapshot)
    assert small.call(lambda: small._kv.exact_n) == exact_n < small.tokens_in_context
    # ...a retry of it does not: it prefills from the first shifted cell.
    text = take_back_last_exchange(chat)
    _, retried = reply_tokens(chat.send(text))
    assert retried.timings.cache_n <= system_cells


def ask_json(*args: str, env: dict) -> list[int]:
    """One ``localchat ask --json`` in a new process; the reply's token ids."""
    result = subprocess.run([sys.executable, "-m", "localchat", "ask", "--json", "--max-tokens", "24",
                             *args], capture_output=True, text=True, env=env, timeout=180)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    return [e["id"] for e in events if e["event"] == "token"]


def test_a_session_continued_in_new_processes_answers_as_a_fresh_prefill(test_model_path, tmp_path,
                                                                         fresh):
    """The reported case: ``ask -s fr`` three times, a system prompt added on the second turn,
    each turn in a new process that restores the session's KV snapshot."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[sampling]\ntemperature = 0\nrepeat_penalty = 1.0\n")
    env = {**os.environ, "LOCALCHAT_HOME": str(home)}
    model = ["-m", str(test_model_path), "-s", "fr"]
    turns = [([], "List three fruits."), (["--system", PIRATE], "What is your favourite food?"),
             ([], "And your favourite drink?")]
    replies = [ask_json(*model, *flags, text, env=env) for flags, text in turns]
    history: list[dict] = []
    for k, ((_, text), reply) in enumerate(zip(turns, replies)):
        history.append({"role": "user", "content": text})
        system = [{"role": "system", "content": PIRATE}] if k else []
        assert reply
        assert_matches_fresh(reply, fresh, system + history)
        history.append({"role": "assistant", "content": fresh.detokenize(reply)})
