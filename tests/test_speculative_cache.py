"""Speculative decoding and the KV cache's other paths: a drafted reply forgotten, saved in a
snapshot and restored, trimmed by a shift, stopped in the middle of a check. Each time the next
turn must build on exactly what one-by-one decoding would have left.

Drafts are forced wherever prompt lookup proposes one (``always_draft``). The scenario test runs
on an engine whose checks are bit-exact (flash attention on one thread: a check's logits are a
single decode's, and a prefill's too), so there every reply, drafted or not, must be the same
token for token, and a reply after a stop must be the one a fresh prefill gives.
"""

from __future__ import annotations

import pytest
from drafting import EDIT, GREEDY, answer
from oracle import assert_matches_fresh, reply_tokens
from store_lock import store_locked

from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.events import Done


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_a_drafted_reply_the_app_cannot_store_is_forgotten_by_the_model_too(engine, always_draft,
                                                                             fresh, monkeypatch):
    """tests/test_faults.py's forgotten reply, drafted: the next turn reuses none of its cells
    and answers as a fresh prefill of the history without it does."""
    from localchat.chat.conversation import Conversation
    from localchat.chat.services import ChatServices
    from localchat.settings import ContextSection, Settings
    from localchat.store import Store
    from localchat.store import store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 50)
    engine.set_speculative("ngram")
    try:
        with Store.open() as store:
            services = ChatServices(Settings(context=ContextSection(summarize=False)), None,
                                    lambda: None)
            conversation = Conversation(store, store.create_session("s"), services)
            conversation.attach(engine, GREEDY)
            first, done = reply_tokens(conversation.send(EDIT[0]["content"]))
            assert done.timings.draft_n > 0
            kept = len(engine.cached_messages()[0].tokens)  # the prompt's own cells
            with store_locked(store.path), pytest.raises(UserError, match="not saved"):
                conversation.record_reply(done, "m")
            second, done = reply_tokens(conversation.send("Now say it in one sentence."))
            assert engine.wait_idle(timeout=60)
            assert [m.role for m in engine.cached_messages()] == ["user", "user", "assistant"]
            assert done.timings.cache_n <= kept + 1  # at most the next header's first token
            assert engine._runtime.max_position() + 1 == engine.tokens_in_context
            assert_matches_fresh(second[:24], fresh,
                                 [EDIT[0], user("Now say it in one sentence.")])
    finally:
        engine.set_speculative(engine.options.speculative)


def _scenario(engine, mode: str) -> dict[str, list[int]]:
    """Turns through every cache path, with speculation ``mode``: the replies by step."""
    engine.set_speculative(mode)
    engine.reset()  # (the scenario's turns build on each other: one reset, at the start)
    replies: dict[str, list[int]] = {}
    drafted = rejected = 0

    def turn(name: str, messages: list[dict[str, str]], sampling: Sampling = GREEDY) -> Done:
        nonlocal drafted, rejected
        tokens, done = reply_tokens(engine.submit(messages, sampling))
        replies[name] = tokens
        drafted += done.timings.draft_n
        rejected += done.timings.draft_n - done.timings.draft_n_accepted
        assert engine._runtime.max_position() + 1 == engine.tokens_in_context, name
        return done

    # A drafted reply, then a turn that forgets it (its history goes on without it).
    system = {"role": "system", "content": "You are a careful editor."}
    turn("first", [system, *EDIT])
    forgotten = [system, EDIT[0], user("Now list the three words you corrected.")]
    second = turn("after a forgotten reply", forgotten)
    # A snapshot after a drafted reply: restored, the next turn is the same.
    snapshot = engine.export_snapshot()
    history = forgotten + [assistant(second.reply), user("Write the fixed text once more.")]
    third = turn("after the snapshot", history)
    engine.import_snapshot(snapshot)
    turn("after restoring it", history)
    # Trimming: the oldest message dropped, the rest of the cache shifted down.
    trimmed = [system, *history[2:], assistant(third.reply), user("And once more, shorter.")]
    shifted = turn("after a trim shift", trimmed)
    assert shifted.timings.context_shift and shifted.timings.approx_n > 0
    # Seeded: drafted too where checks are exact.
    turn("seeded", trimmed, Sampling(temperature=0.7, seed=3, repeat_penalty=1.1, max_tokens=48))
    if mode != "off":
        assert drafted > 20 and rejected > 0, (drafted, rejected)
    return replies


def test_every_cache_path_after_drafted_replies_is_what_plain_decoding_leaves(exact_engine,
                                                                              always_draft):
    engine = exact_engine
    assert engine._runtime.exact_checks
    plain = _scenario(engine, "off")
    drafted = _scenario(engine, "ngram")
    assert plain["after the snapshot"] == plain["after restoring it"]
    for step, tokens in plain.items():
        assert drafted[step] == tokens, step


def test_a_stop_during_a_check_leaves_what_a_fresh_prefill_gives(exact_engine, always_draft):
    """On the bit-exact engine: stopped while a check is decoded, the reply's record is its
    cells, and the next turn is token for token the one a fresh prefill of the same history
    gives (there a prefill rounds as one-by-one decoding does)."""
    engine = exact_engine
    runtime = engine._runtime
    decode = runtime.decode
    handle = None
    checks = []

    def stopping(tokens, start_pos, abortable=False, outputs=1):
        if outputs > 1 and handle is not None and len(checks) < 3:
            checks.append(len(tokens))
            if len(checks) == 3:
                handle.stop()  # the stop arrives while the third check is decoded
        return decode(tokens, start_pos, abortable, outputs)

    runtime.decode = stopping
    try:
        handle = engine.submit(EDIT, Sampling(temperature=0.0, repeat_penalty=1.0,
                                              max_tokens=200))
        final = handle.wait(60)
    finally:
        runtime.decode = decode
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert len(checks) == 3
    assert runtime.max_position() + 1 == engine.tokens_in_context
    # The prompt's cells and the reply's evaluated tokens (all but the last sampled).
    held = engine.prompt_tokens(EDIT) + final.timings.predicted_n - 1
    assert engine.tokens_in_context == held
    history = EDIT + [assistant(final.reply), user("Thanks. Now in capitals?")]
    after_stop, _ = reply_tokens(engine.submit(history, GREEDY))
    from_fresh, _ = answer(engine, "off", history)
    assert after_stop == from_fresh
