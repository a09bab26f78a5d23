"""The confidence monitor over a local reply: low token probability, loops, length cuts."""

from __future__ import annotations

from localchat.events import Done, Timings, Token
from localchat.remote.confidence import ConfidenceMonitor, find_loop
from localchat.remote.settings import ConfidenceThresholds


def feed(monitor: ConfidenceMonitor, tokens: list[Token]):
    for index, token in enumerate(tokens):
        trigger = monitor.observe(token)
        if trigger is not None:
            return index, trigger
    return None, None


def test_low_quantile_below_threshold_fires_only_after_the_minimum_tokens():
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=10, quantile=0.1, low_prob=0.05))
    index, trigger = feed(monitor, [Token(f" w{i}", prob=0.01) for i in range(30)])
    assert index == 9  # the tenth token: the first moment a judgement is allowed
    assert trigger.kind == "low-confidence" and "after 10 tokens" in trigger.reason


def test_a_confident_reply_with_one_unsure_token_in_twenty_does_not_fire():
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=16, quantile=0.1, low_prob=0.05))
    tokens = [Token(f" w{i}", prob=0.01 if i % 20 == 0 else 0.8) for i in range(60)]
    assert feed(monitor, tokens) == (None, None)


def test_without_probabilities_only_loops_and_length_can_fire():
    monitor = ConfidenceMonitor()
    assert feed(monitor, [Token(f" word{i}") for i in range(100)]) == (None, None)
    assert monitor.low_quantile() is None


def test_a_repetition_loop_fires():
    monitor = ConfidenceMonitor()
    tokens = [Token("Sure."), *[Token(" I can help with that.") for _ in range(5)]]
    index, trigger = feed(monitor, tokens)
    assert trigger.kind == "loop" and "repeated" in trigger.reason


def test_a_reply_that_ran_out_of_context_fires_when_it_ends():
    monitor = ConfidenceMonitor()
    done = Done("long reply", "length", Timings(predicted_n=512, n_ctx=1024, n_ctx_used=1023))
    trigger = monitor.finished(done)
    assert trigger.kind == "length" and "1024" in trigger.reason
    assert ConfidenceMonitor(ConfidenceThresholds(escalate_on_length=False)).finished(done) is None
    assert ConfidenceMonitor().finished(Done("short", "stop")) is None


def test_a_reply_cut_by_the_users_max_tokens_does_not_fire():
    done = Done("cut reply", "length", Timings(predicted_n=48, n_ctx=4096, n_ctx_used=120))
    assert ConfidenceMonitor().finished(done) is None


def test_it_fires_once():
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=1))
    assert monitor.observe(Token("a", prob=0.0)) is not None
    assert monitor.observe(Token("b", prob=0.0)) is None
    assert monitor.finished(Done("ab", "length")) is None


def test_find_loop_needs_enough_copies_and_characters():
    assert find_loop("intro " + "na" * 30, 48, 3) == ("na", 30)
    assert find_loop("ha ha ha", 48, 3) is None  # too short to be a loop
    assert find_loop("Each sentence here differs from the one before it, as prose does.", 48, 3) is None
    assert find_loop("x" + " " * 80, 48, 3) is None  # trailing whitespace is not a loop
