"""The confidence monitor over a local reply: low token probability, loops, length cuts."""

from __future__ import annotations

from localchat.events import Done, Timings, Token
from localchat.remote.confidence import ConfidenceMonitor, find_loop, scaled
from localchat.settings.remote import ConfidenceThresholds


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


def test_the_sampled_token_probability_rule_is_off_unless_the_user_sets_low_prob():
    # An unlucky draw at temperature 0.7 is not the model being unsure (see settings.py).
    assert feed(ConfidenceMonitor(), [Token(f" w{i}", prob=0.001) for i in range(32)]) == (None, None)


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
    assert monitor.observe(Token("a", entropy=9.0)) is not None
    assert monitor.observe(Token("b", entropy=9.0)) is None
    assert monitor.finished(Done("ab", "length")) is None


def test_find_loop_needs_enough_copies_and_characters():
    assert find_loop("intro " + "na" * 30, 48, 3) == ("na", 30)
    assert find_loop("ha ha ha", 48, 3) is None  # too short to be a loop
    assert find_loop("Each sentence here differs from the one before it, as prose does.", 48, 3) is None
    assert find_loop("x" + " " * 80, 48, 3) is None  # trailing whitespace is not a loop


# -- uncertain start: entropy and top-2 margin over the first tokens ---------------------------

def numbered(n: int, *, entropy: float | None = None, margin: float | None = None) -> list[Token]:
    return [Token(f" w{i}", entropy=entropy, margin=margin) for i in range(n)]


def test_a_high_mean_entropy_over_the_window_fires_when_the_window_fills():
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=16, max_entropy=2.0))
    index, trigger = feed(monitor, numbered(32, entropy=3.0))
    assert index == 15
    assert trigger.kind == "low-confidence" and "mean entropy 3.00 nats > 2.00" in trigger.reason


def test_a_low_mean_margin_over_the_window_fires():
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=8, min_margin=0.3))
    index, trigger = feed(monitor, numbered(32, margin=0.1))
    assert index == 7 and "top-2 margin 0.10 < 0.30" in trigger.reason


def test_a_confident_start_does_not_fire():
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=16, max_entropy=2.0, min_margin=0.3))
    assert feed(monitor, numbered(32, entropy=0.5, margin=0.8)) == (None, None)


def test_the_window_slides_while_the_engine_gives_numbers():
    # Sure for 10 tokens, then guessing: the 16-token window's mean passes 2.0 at token 21
    # (5 sure tokens left in it: 11 * 3.0 / 16 = 2.06).
    tokens = numbered(10, entropy=0.0) + numbered(22, entropy=3.0)
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=16, max_entropy=2.0))
    index, trigger = feed(monitor, tokens)
    assert index == 20 and "at token 21" in trigger.reason


def test_tokens_without_numbers_never_fire_the_confidence_signals_nor_delay_the_verdict():
    # The engine stops giving numbers after its window: a reply that was sure of its first 32
    # tokens is not judged again, however many tokens follow.
    monitor = ConfidenceMonitor(ConfidenceThresholds(min_tokens=16, max_entropy=2.0))
    tokens = numbered(32, entropy=0.5) + [Token(f" x{i}") for i in range(300)]
    assert feed(monitor, tokens) == (None, None)
    assert monitor.tokens_seen == 332
    # Too few numbers for a window: no verdict, and no waiting for numbers that never come.
    short = ConfidenceMonitor(ConfidenceThresholds(min_tokens=16, max_entropy=2.0))
    assert feed(short, numbered(8, entropy=3.0) + [Token(f" y{i}") for i in range(50)]) == (None, None)


def test_a_larger_model_gets_more_permissive_limits():
    base = ConfidenceThresholds(max_entropy=2.0, min_margin=0.3)
    small, large = scaled(base, 135_000_000), scaled(base, 8_000_000_000)
    assert small.max_entropy == base.max_entropy and small.min_margin == base.min_margin
    assert large.max_entropy > small.max_entropy and large.min_margin < small.min_margin
    assert scaled(base, None) == base
    # The same hesitant start escalates the small model's reply and not the large one's.
    tokens = numbered(16, entropy=2.3, margin=0.5)
    assert feed(ConfidenceMonitor(small), tokens)[1] is not None
    assert feed(ConfidenceMonitor(large), tokens) == (None, None)
