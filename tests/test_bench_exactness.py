"""bench's exactness split: exact, near-tie, wrong, on shifted cells, and not comparable after
a reply whose text does not tokenize back to the sampled tokens (plain logic over a stub)."""

from __future__ import annotations

from localchat.bench.conversation import Replayed, exactness
from localchat.events import Timings


class Tokens:
    """Tokenizes by characters; token 99 prints nothing (a padding token of a synthetic vocab)."""

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens if t != 99)

    def fresh_logits(self, messages, reply):
        return {ord("a"): 1.0, ord("b"): 0.9, ord("c"): 3.0}


def turn(tokens: list[int], approx: int = 0) -> Replayed:
    return Replayed(Timings(approx_n=approx), tokens, [{"role": "user", "content": "x"}])


def test_each_turn_lands_in_one_bucket():
    a, b, c = ord("a"), ord("b"), ord("c")
    cached = [turn([a, a]), turn([a, b]), turn([b]), turn([a], approx=5)]
    fresh = [turn([a, a]), turn([a, a]), turn([c]), turn([c])]
    result = exactness(Tokens(), cached, fresh)
    assert (result["exact_turns"], result["near_tie_turns"], result["wrong_turns"],
            result["approx_turns"], result["not_comparable_turns"]) == (1, 1, 1, 1, 0)


def test_turns_after_a_reply_that_does_not_tokenize_back_are_not_compared():
    a, c = ord("a"), ord("c")
    cached = [turn([a, 99]), turn([a]), turn([a])]
    fresh = [turn([a, 99]), turn([c]), turn([c])]
    result = exactness(Tokens(), cached, fresh)
    assert result["exact_turns"] == 1 and result["wrong_turns"] == 0
    assert result["not_comparable_turns"] == 2


class PenalizedTokens(Tokens):
    """Fresh logits where 'c' leads 'b' by 1.2, until the repeat penalty lowers 'c' (seen)."""

    def fresh_logits(self, messages, reply):
        import numpy as np

        logits = np.zeros(128, dtype=np.float32)
        logits[ord("b")], logits[ord("c")] = 1.8, 3.0
        return logits


def test_the_margin_is_taken_after_the_repeat_penalty_the_turns_sampled_with():
    b, c = ord("b"), ord("c")
    cached, fresh = [turn([c, c, b])], [turn([c, c, c])]
    assert exactness(PenalizedTokens(), cached, fresh)["wrong_turns"] == 1
    result = exactness(PenalizedTokens(), cached, fresh, repeat_penalty=1.5)
    assert (result["near_tie_turns"], result["wrong_turns"]) == (1, 0)
    assert result["first_differences"] == [{"turn": 1, "token": 2, "margin": 0.2}]
