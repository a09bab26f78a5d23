"""Prefill while typing (session/draft.py): the draft is prefilled in steps in the background,
the real turn then evaluates only what changed, an edit in the middle re-prefills from the first
changed token and nothing before it, and every reply equals a fresh prefill's (the oracle)."""

from __future__ import annotations

import time

from oracle import GREEDY, assert_matches_fresh, reply_tokens

from localchat.context.chat_context import ChatContext
from localchat.context.draft import STEP_CHARS, next_prefix

PASTE = " ".join(f"Item {i}: the {['red', 'green', 'blue', 'amber'][i % 4]} box holds {i * 7} marbles."
                 for i in range(40))  # ~1,900 characters, ~600 tokens


def test_steps_advance_by_about_a_step_and_end_after_whitespace():
    text = "word " * 300
    first = next_prefix(text, "")
    assert first.endswith(" ") and STEP_CHARS - 10 <= len(first) <= STEP_CHARS
    assert len(next_prefix(text, first)) > len(first) + STEP_CHARS - 10
    assert next_prefix(text, text) == ""
    assert next_prefix("short draft", "") == "short draft"  # close enough: all of it


def test_an_edit_restarts_from_the_changed_character_not_from_the_start():
    old = "a " * 600
    edited = old[:300] + "CHANGED " + old[300:]
    following = next_prefix(edited, old)
    assert following.startswith(edited[:300]) and len(following) <= 300 + STEP_CHARS


def test_nothing_is_prefilled_while_a_reply_runs():
    class Busy:
        def prepare(self, messages, tools=()):
            raise AssertionError("prepared during a reply")

    chat = ChatContext(Busy())
    chat._current = type("Running", (), {"finished": False})()  # a reply is streaming
    assert chat.draft_messages("hello") is None
    chat.draft.update("hello there")  # no step starts


def settle(chat: ChatContext, text: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while chat.draft.cached_text != text:
        assert time.monotonic() < deadline, f"draft prefill stuck at {len(chat.draft.cached_text)} chars"
        time.sleep(0.02)


def started_chat(engine) -> ChatContext:
    chat = ChatContext(engine, system="You are a helpful assistant.", sampling=GREEDY)
    reply_tokens(chat.send("Remember these boxes."))
    return chat


def test_a_prefilled_draft_leaves_only_the_reply_header_to_evaluate_and_the_reply_is_exact(engine, fresh):
    chat = started_chat(engine)
    chat.draft.update(PASTE)
    settle(chat, PASTE)
    assert chat.draft.steps >= 2  # in steps, so that a stop loses at most one

    tokens, done = reply_tokens(chat.send(PASTE))
    assert done.timings.prompt_n <= 5  # the assistant header (and a token at the cut), not ~600
    assert_matches_fresh(tokens, fresh, chat.last_sent)


def test_an_edit_mid_draft_reprefills_from_the_first_changed_token_only_and_stays_exact(engine, fresh):
    chat = started_chat(engine)
    head, tail = PASTE[:900], PASTE[900:1300]
    draft = head + tail
    chat.draft.update(draft)
    settle(chat, draft)
    edited = head + "Also, one box is empty. " + tail
    steps_before = chat.draft.steps
    chat.draft.update(edited)
    settle(chat, edited)

    steps = chat.draft.step_timings[steps_before:]
    unchanged = engine.prompt_tokens(chat.model_messages() + [{"role": "user", "content": head}], False)
    changed = engine.prompt_tokens(chat.model_messages() + [{"role": "user", "content": edited}], False)
    # The first step after the edit reused everything up to it, less the end marker and the
    # token at the cut (<= 3); all the steps together prefilled only what follows the edit.
    assert unchanged - 3 <= steps[0].cache_n <= unchanged
    assert sum(s.prompt_n for s in steps) <= changed - unchanged + 3 * len(steps)

    tokens, done = reply_tokens(chat.send(edited))
    assert done.timings.prompt_n <= 5
    assert_matches_fresh(tokens, fresh, chat.last_sent)


def test_sending_while_a_step_runs_reuses_every_finished_step_and_the_reply_is_exact(engine, fresh):
    chat = started_chat(engine)
    history = engine.prompt_tokens(chat.model_messages(), False)
    chat.draft.update(PASTE)
    while not chat.draft.steps:  # one step done, the next one running
        time.sleep(0.01)
    tokens, done = reply_tokens(chat.send(PASTE))
    # The running step was stopped at once and kept what it had evaluated, as did every
    # finished step: the turn reuses all of it.
    assert done.timings.cache_n >= history + len(chat.draft.step_timings) * 20
    assert done.timings.prompt_n < engine.count_tokens(PASTE)
    assert_matches_fresh(tokens, fresh, chat.last_sent)
    reply_tokens(chat.send("Thanks."))  # and the conversation goes on from there


def test_a_stopped_draft_step_keeps_what_it_evaluated_for_the_turn(engine, fresh):
    """Prefill is abortable at once without losing work: a prepare stopped half-way keeps its
    cells as a partial record, and the turn that stopped it reuses them (exactly)."""
    chat = started_chat(engine)
    history = engine.prompt_tokens(chat.model_messages(), False)
    handle = engine.prepare(chat.model_messages() + [{"role": "user", "content": PASTE}])
    for event in handle:
        if getattr(event, "done", 0) >= 256:  # two 128-token chunks evaluated
            handle.stop()
    assert handle.result.finish_reason == "aborted"
    partial = engine.cached_messages()[-1]
    assert partial.partial and engine.tokens_in_context >= history + 250  # all 256 but the stop
    tokens, done = reply_tokens(chat.send(PASTE))
    assert done.timings.cache_n >= history + 250
    assert_matches_fresh(tokens, fresh, chat.last_sent)
