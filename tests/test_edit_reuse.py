"""Editing an earlier prompt (a fork) on the real model: the KV cache keeps exactly the cells
before the edited message, only that message is prefilled, and the reply equals a fresh
prefill's (the oracle)."""

from __future__ import annotations

from oracle import GREEDY, assert_matches_fresh, reply_tokens

from localchat.context.chat_context import ChatContext


def test_an_edited_prompt_prefills_only_itself_after_the_fork_and_is_exact(engine, fresh):
    chat = ChatContext(engine, system="You are a helpful assistant.", sampling=GREEDY)
    for text in ("Name three colors.", "Which one is the warmest?", "And the coldest?"):
        reply_tokens(chat.send(text))
    chat.rewind(2)  # edit the second prompt: keep the first exchange only
    before_fork = engine.prompt_tokens(chat.model_messages(), False)
    edited = "Which one is the coolest?"
    tokens, done = reply_tokens(chat.send(edited))
    whole = engine.prompt_tokens(chat.last_sent, True)
    # Everything before the fork is reused (and the edited prompt's first tokens where they
    # equal the old prompt's: those cells were computed from exactly the same tokens), so at
    # most the edited message and the reply header are prefilled.
    assert done.timings.cache_n >= before_fork - 1
    assert done.timings.cache_n + done.timings.prompt_n == whole
    assert done.timings.prompt_n <= whole - before_fork + 1
    assert_matches_fresh(tokens, fresh, chat.last_sent)
