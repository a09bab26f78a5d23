"""The saved-state pool's rules (engine/state_pool.py), on records and snapshots alone: which
state a turn takes, when the live one is saved, containment and the byte cap. The oracle tests
through the API (test_serve_clients.py) check the same with the real model."""

from __future__ import annotations

from localchat.engine.layout import PROMPT, CachedMessage, ChatPrompt, RawPrompt
from localchat.engine.snapshot_file import KVSnapshot
from localchat.engine.state_pool import StatePool, StateView


def record(role: str, content: str, n: int, first: int = 0, open_: bool = False) -> CachedMessage:
    return CachedMessage(role, content, f"<{role}>{content}", list(range(first, first + n)), open=open_)


def conversation(topic: str, turns: int, size: int = 10) -> list[CachedMessage]:
    """A system prompt shared by every conversation, then ``turns`` exchanges about ``topic``."""
    records = [record("system", "be brief", 5)]
    for i in range(turns):
        base = 1000 * (hash(topic) % 97) + 100 * i
        records += [record("user", f"{topic} {i}", size, base),
                    record("assistant", f"reply {topic} {i}", size, base + 50, open_=i == turns - 1)]
    return records


def chat(messages: list[dict]) -> ChatPrompt:
    """``messages`` as this file's template renders them (``record``'s text), then the reply's
    header."""
    return ChatPrompt(messages, "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")


def messages_of(records: list[CachedMessage], *new: str) -> ChatPrompt:
    return chat([{"role": r.role, "content": r.content} for r in records] + [
        {"role": "user", "content": text} for text in new])


def snapshot(records: list[CachedMessage], state_bytes: int = 100) -> KVSnapshot:
    n = sum(len(r.tokens) for r in records)
    return KVSnapshot(records, b"x" * state_bytes, n)


def live_of(records: list[CachedMessage]) -> StateView:
    return StateView(records, sum(len(r.tokens) for r in records))


def test_a_conversation_going_on_keeps_the_live_state_and_saves_nothing():
    pool = StatePool(10_000)
    live = conversation("sea", 2)

    chosen = pool.swap(live_of(live), messages_of(live, "more"), False, lambda: snapshot(live))

    assert chosen is None and len(pool) == 0


def test_another_conversation_saves_the_live_one_and_takes_its_own_back():
    pool = StatePool(10_000)
    sea, hills = conversation("sea", 2), conversation("hills", 3)
    pool.save(snapshot(hills))

    chosen = pool.swap(live_of(sea), messages_of(hills, "more"), False, lambda: snapshot(sea))

    assert chosen is not None and chosen.records == hills  # taken out of the pool ...
    assert [s.records for s in pool._entries] == [sea]  # ... and the live one saved in its place


def test_a_new_conversation_keeps_the_shared_system_prompt_live_and_saves_the_old_one():
    pool = StatePool(10_000)
    sea = conversation("sea", 2)

    chosen = pool.swap(live_of(sea), chat([{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hello"}]),
                       False, lambda: snapshot(sea))

    assert chosen is None and len(pool) == 1


def test_a_state_that_would_keep_under_a_quarter_of_itself_is_not_restored():
    pool = StatePool(10_000)
    long = conversation("sea", 8)  # 165 tokens, of which the first exchange is 25
    pool.save(snapshot(long))
    asked = messages_of(long[:2], "something else")  # keeps 15 of its 165 tokens

    assert pool.swap(live_of([]), asked, False, lambda: snapshot([])) is None
    assert len(pool) == 1


def test_only_exact_cells_count_and_memories_that_cannot_drop_cells_roll_back_to_a_checkpoint():
    records = conversation("sea", 3)  # 5 + 3 x 20 tokens
    asked = messages_of(records[:4], "edited question")  # keeps 5 + 20 + 10 = 35 tokens
    assert StateView(records, 65).kept(asked) == 35
    assert StateView(records, 12).kept(asked) == 12  # cells past exact_n were shifted
    assert StateView(records, 65, checkpoints=[5, 25, 50]).kept(asked) == 25
    assert StateView(records, 65, checkpoints=[5]).kept(messages_of(records, "more")) == 65


def test_a_message_rendered_another_way_keeps_nothing_of_its_record():
    # The same question asked before with tools offered: the template wrote them ahead of it,
    # so that record's text and tokens are not this turn's, whatever its role and content.
    asked = chat([{"role": "user", "content": "name a colour"}])
    offered = [CachedMessage("user", "name a colour", "<tools>...</tools><user>name a colour",
                             list(range(200))),
               CachedMessage("assistant", "", "<assistant>", [7, 8], open=True)]
    plain = [record("user", "name a colour", 30, 500), record("assistant", "red", 17, 600, open_=True)]
    assert StateView(offered, 202).kept(asked) == 0
    assert StateView(plain, 47).kept(asked) == 30

    pool = StatePool(10_000)
    pool.save(snapshot(offered))
    # The live state keeps 30 of 47 tokens, the saved one (by role and content) 200 of 202: it
    # would have been restored, and the turn prefilled all but its first 3 tokens.
    assert pool.swap(live_of(plain), asked, False, lambda: snapshot(plain)) is None


def test_saving_skips_what_is_held_and_replaces_what_it_holds():
    pool = StatePool(10_000)
    short, longer = conversation("sea", 1), conversation("sea", 2)
    longer[2] = record("assistant", "reply sea 0", 10, 1000 * (hash("sea") % 97) + 50)
    assert pool.save(snapshot(short))
    assert pool.save(snapshot(longer))  # holds the short one whole: that one goes
    assert [s.records for s in pool._entries] == [longer]
    assert not pool.save(snapshot(short))  # already held whole by an entry


def test_least_recently_saved_states_go_first_beyond_the_cap():
    pool = StatePool(250)
    states = [conversation(topic, 1) for topic in ("a", "b", "c")]
    for records in states:
        pool.save(snapshot(records))

    assert [s.records for s in pool._entries] == states[1:]
    assert pool.size_bytes == 200
    assert not pool.save(snapshot(conversation("d", 1), state_bytes=300))  # larger than the cap


def test_the_state_taken_back_is_out_before_saving_the_live_one_evicts_it():
    # --cache-ram 12 with two ~7 MiB conversations: A saved, B live, A again. Saving B must
    # evict A to fit, and A is the one to restore (issue 46: a ValueError from list.remove).
    pool = StatePool(120)
    a, b = conversation("a", 2), conversation("b", 2)
    pool.save(snapshot(a, state_bytes=70))

    chosen = pool.swap(live_of(b), messages_of(a, "more"), False, lambda: snapshot(b, state_bytes=70))

    assert chosen is not None and chosen.records == a
    assert [s.records for s in pool._entries] == [b] and pool.size_bytes <= pool.cap_bytes


def prompt_state(tokens: list[int], reply: list[int]) -> list[CachedMessage]:
    """A completion's state: its prompt given as tokens, then the reply."""
    return [CachedMessage(PROMPT, "", "", tokens),
            CachedMessage("assistant", "", "", reply, open=True)]


def test_a_prompt_given_as_tokens_keeps_the_leading_tokens_it_shares_with_a_state():
    state = prompt_state(list(range(20)), [90, 91])

    assert StateView(state, 22).kept(RawPrompt(tuple(range(25)))) == 20
    assert StateView(state, 22).kept(RawPrompt((*range(20), 90, 7))) == 21  # into the reply
    assert StateView(state, 10).kept(RawPrompt(tuple(range(25)))) == 10  # exact cells only
    assert StateView(conversation("sea", 1), 25).kept(RawPrompt(tuple(range(5)))) == 5


def test_the_next_keystroke_of_a_completion_does_not_save_the_live_state():
    pool = StatePool(10_000)
    live = prompt_state(list(range(20)), [90, 91])
    typed = RawPrompt((*range(19), 40, 41))  # the last token changed, two more

    assert pool.swap(live_of(live), typed, False, lambda: snapshot(live)) is None
    assert len(pool) == 0  # keeps 19 of 22 tokens: an edit of the live state, not another one


def test_a_chat_after_completions_saves_them_and_a_completion_takes_them_back():
    pool = StatePool(10_000)
    completion, sea = prompt_state(list(range(20)), [90, 91]), conversation("sea", 2)

    assert pool.swap(live_of(completion), messages_of(sea, "more"), False,
                     lambda: snapshot(completion)) is None
    chosen = pool.swap(live_of(sea), RawPrompt((*range(20), 30)), False, lambda: snapshot(sea))

    assert chosen is not None and chosen.records == completion
    assert [s.records for s in pool._entries] == [sea]
