"""Speculative decoding: drafted tokens checked in one decode change how fast a reply comes,
never the reply, and leave the KV cache exactly as one-by-one decoding would.

The drafting policy only drafts where it expects a gain, which on a busy test machine may be
nowhere; the real-model tests below make it draft wherever a drafter proposes (``always_draft``),
so that every reply goes through checks, hits and misses alike.
"""

from __future__ import annotations

import numpy as np
import pytest
from drafting import EDIT, GREEDY, answer
from oracle import assert_matches_fresh, loaded_engine, reply_tokens

from localchat.engine import speculate
from localchat.engine.image_records import placeholders
from localchat.engine.ngram import TokenLog, lookup
from localchat.engine.options import Sampling
from localchat.engine.sampling.sampler import Sampler
from localchat.engine.speculate import Acceptance, DraftPolicy, TurnDrafts, best_length
from localchat.events import Done, Notice, Timings, Token


@pytest.fixture
def spec_engine(engine, always_draft):
    """The shared engine, drafting by prompt lookup."""
    engine.set_speculative("ngram")
    yield engine
    engine.set_speculative(engine.options.speculative)  # as loaded: the default


# -- prompt lookup and the policy, without a model -------------------------------------------

def test_lookup_drafts_what_followed_the_most_recent_longest_match():
    tokens = np.array([5, 1, 2, 3, 9, 8, 2, 3, 7, 7, 1, 2, 3], dtype=np.int32)
    # "1 2 3" occurred at 1..3 (then 9 8); "2 3" also at 6..7 (then 7 7), more recent but shorter.
    match = lookup(tokens, 4)
    assert match is not None and match.draft == [9, 8, 2, 3] and match.length == 3
    assert lookup(np.array([4, 5, 6, 7], dtype=np.int32), 4) is None  # nothing recurs
    assert lookup(np.array([1, 2, 9, 1, 2], dtype=np.int32), 4).draft == [9, 1, 2]
    # A one-token key is not a match; an end-of-generation token ends the draft before it.
    assert lookup(np.array([3, 1, 9, 1], dtype=np.int32), 4) is None
    assert lookup(np.array([1, 2, 0, 7, 1, 2], dtype=np.int32), 4, is_end=lambda t: t == 0) is None


def test_the_token_log_grows_in_place():
    log = TokenLog([1, 2])
    for token in range(3, 200):
        log.append(token)
    assert len(log) == 199 and log.tokens[-1] == 199 and log.tokens[:3].tolist() == [1, 2, 3]


def test_the_policy_drafts_only_where_a_check_is_expected_to_pay():
    prior = speculate.prior_check_cost
    assert best_length(0.3, 8, prior) == 0  # mostly wrong drafts: plain decoding is faster
    assert best_length(0.95, 16, prior) >= 8  # a passage being copied: long checks are cheap
    assert best_length(0.95, 16, lambda k: 0.02 * k) == 16  # checks nearly free (a GPU)
    assert prior(1) == pytest.approx(0.42) and prior(3) == pytest.approx(1.39)
    assert prior(24) == pytest.approx(6.8)  # beyond the last point: its slope
    policy = DraftPolicy()
    for _ in range(8):
        policy.decoded(1, 10.0)
        policy.decoded(5, 30.0)
    assert policy.check_cost(4) == pytest.approx(2.0)  # its own checks of 4 drafted tokens
    # Other sizes: the prior curve scaled to this machine (2.0 against the prior's 1.8).
    assert policy.check_cost(8) == pytest.approx(3.2 * 2.0 / 1.8)
    policy.decoded(1, 5000.0)  # one decode held up by another program does not decide
    assert policy.check_cost(4) == pytest.approx(2.0)
    rate = Acceptance.prior(0.5)
    rate.record(4, 4)
    assert rate.rate > 0.5


def test_a_lookup_draft_stops_before_a_pictures_placeholders():
    picture = placeholders("ab" * 32, 3)  # negative 64-bit ids (image_records)
    log = TokenLog([5, 1, 2, 3, *picture, 4, 1, 2])
    log.append(3)
    match = lookup(log.tokens, 6)
    assert match is None or all(token >= 0 for token in match.draft)
    log = TokenLog([1, 2, 3, 7, *picture, 1, 2, 3])
    assert lookup(log.tokens, 6).draft == [7]


def test_the_lookup_ceiling_is_the_best_draft_schedule_by_hindsight():
    from localchat.bench.lookup_ceiling import lookup_ceiling

    passage = list(range(100, 140))
    free = lambda k: 0.0  # noqa: E731 - checks cost nothing: each check yields the whole match
    # A reply copying 40 tokens of the prompt: after its first two, lookups draft the rest.
    assert lookup_ceiling([1, *passage, 2], passage, free) > 6
    assert lookup_ceiling([1, *passage, 2], passage, speculate.prior_check_cost) > 1.5
    # Nothing to copy: plain decoding is the best there is.
    assert lookup_ceiling([1, 2, 3], list(range(200, 240)), free) == 1.0
    # Drafts that are always wrong are never worth a check, however cheap.
    copied_wrong = [*passage[:2], *range(300, 338)]
    assert lookup_ceiling([1, *passage], copied_wrong, lambda k: 0.01) == 1.0
    # Dear checks make even a right copy pay less.
    assert lookup_ceiling([1, *passage], passage, lambda k: 3.0 * k) < \
        lookup_ceiling([1, *passage], passage, speculate.prior_check_cost)


def test_a_lookup_that_matches_far_back_drafts_as_far_at_once():
    """A copied passage: the first check may already take the whole match, where the turn's
    doubling length (START_LENGTH) would hold it to 4."""
    passage = list(range(100, 140))
    log = TokenLog([*passage, *passage[:16]])  # the reply has copied 16 tokens of it so far
    drafts = TurnDrafts(DraftPolicy(), ngram=True, model=None)
    draft = drafts.propose(log, 64, lambda: False)
    assert len(draft) > speculate.START_LENGTH and draft == passage[16:16 + len(draft)]
    short = TokenLog([*passage, 7, *passage[:3]])  # a 3-token match: no further than the length
    assert len(TurnDrafts(DraftPolicy(), ngram=True, model=None).propose(short, 64, lambda: False)) <= 4


def test_a_match_into_the_conversation_is_a_copy_one_into_the_reply_a_phrase():
    """Where the match points decides its rate: the prompt an edit copies from, or the reply's
    own earlier tokens (mostly a phrase that recurs)."""
    passage = list(range(100, 140))
    into_history = TokenLog(passage)
    for token in (7, 100, 101):  # the reply: a new token, then the passage's first two again
        into_history.append(token)
    assert TurnDrafts(DraftPolicy(), ngram=True, model=None).propose(into_history, 64, lambda: False)
    into_reply = TokenLog([1, 2, 3])
    for token in (100, 101, 9, 100, 101):  # the reply repeats its own two tokens
        into_reply.append(token)
    assert TurnDrafts(DraftPolicy(), ngram=True, model=None).propose(into_reply, 64, lambda: False) == []


def test_a_copy_resuming_after_an_edit_has_its_own_rate():
    policy = DraftPolicy()
    passage = list(range(100, 140))
    log = TokenLog(passage)
    drafts = TurnDrafts(policy, ngram=True, model=None)
    for token in (7, *range(100, 108)):
        log.append(token)
    draft = drafts.propose(log, 64, lambda: False)
    assert len(draft) > 2 and draft[:2] == [108, 109]
    drafts.checked(len(draft), 2)  # 108, 109 kept, then the reply edits: 55 instead of 110
    for token in (108, 109, 55, 111, 112):  # ... and goes on copying just after the edit
        log.append(token)
    before = policy.resume.hits
    draft = drafts.propose(log, 64, lambda: False)
    assert draft and draft[0] == 113
    drafts.checked(len(draft), len(draft))
    assert policy.resume.hits > before  # the check taught the resumed copy's rate


def test_a_streak_that_says_no_draft_does_not_stop_drafting_for_the_turn():
    """Right after a draft accepted whole the streak's rate decides; where it says no, the match
    is judged on its own (a long match into the prompt is still a copy), now and later."""
    policy = DraftPolicy()
    policy.streak = Acceptance(hits=0.0, misses=100.0)  # streaks never pay here
    passage = list(range(100, 160))
    log = TokenLog(passage)
    for token in passage[:16]:  # the reply has copied 16 tokens so far
        log.append(token)
    drafts = TurnDrafts(policy, ngram=True, model=None)
    draft = drafts.propose(log, 64, lambda: False)
    assert draft == passage[16:16 + len(draft)]
    drafts.checked(len(draft), len(draft))
    for token in passage[16:17 + len(draft)]:  # the accepted draft and the token after it
        log.append(token)
    following = drafts.propose(log, 64, lambda: False)
    assert following and following[0] == passage[17 + len(draft)]
    assert policy.streak.hits == 0.0  # the streak's own rate was not what drafted it


def test_the_draft_length_doubles_after_hits_and_falls_back_after_a_miss():
    drafts = TurnDrafts(DraftPolicy(), ngram=True, model=None)
    assert drafts.length == speculate.START_LENGTH
    drafts.checked(4, 4)
    drafts.checked(8, 8)
    assert drafts.length == 16
    drafts.checked(16, 16)
    assert drafts.length == speculate.MAX_LENGTH
    drafts.checked(16, 2)
    assert drafts.length == 3


# -- checks on the real model ----------------------------------------------------------------

def test_a_greedy_reply_with_drafts_is_the_reply_without_them(spec_engine, fresh):
    tokens, done = reply_tokens(spec_engine.submit(EDIT, GREEDY))
    timings = done.timings
    assert timings.draft_n > 0 and 0 < timings.draft_n_accepted <= timings.draft_n
    assert {"draft_n", "draft_n_accepted"} <= set(timings.to_dict())
    assert timings.predicted_n == len(tokens)
    assert_matches_fresh(tokens, fresh, EDIT)
    # The cache holds exactly the reply's evaluated tokens: no rejected draft is left.
    assert spec_engine._runtime.max_position() + 1 == spec_engine.tokens_in_context


def test_the_sampler_draws_once_per_position_in_order(spec_engine, monkeypatch):
    """Drafted and checked, a reply sampled at temperature 0.7 with a fixed seed is the one
    decoding without drafts gives, up to where a check's logits differ from a single decode's
    (other CPU kernels for several query tokens: the cause of greedy near-ties): up to there
    every draw matches, one per token, in order. (The engine does not draft seeded turns, so
    that a fixed seed keeps giving the same reply: here it is made to.)"""
    monkeypatch.setattr(speculate, "reproducible_with_drafts", lambda sampling: True)
    seen: list[np.ndarray] = []
    original = Sampler.sample

    def recording(self, index=-1):
        seen.append(np.array(self._logits(index)))
        return original(self, index)

    monkeypatch.setattr(Sampler, "sample", recording)
    seeded = Sampling(temperature=0.7, seed=7, repeat_penalty=1.1, max_tokens=48)
    runs = {}
    for mode in ("off", "ngram"):
        seen.clear()
        tokens, done = answer(spec_engine, mode, EDIT, seeded)
        runs[mode] = tokens, list(seen), done.timings
    (plain, plain_logits, _), (drafted, drafted_logits, timings) = runs["off"], runs["ngram"]
    assert timings.draft_n > 0
    for run_tokens, logits in ((plain, plain_logits), (drafted, drafted_logits)):
        assert len(logits) == len(run_tokens) + (len(run_tokens) < seeded.max_tokens)
    first = next((i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b), None)
    if first is not None:
        assert not np.array_equal(plain_logits[first], drafted_logits[first]), (
            f"the replies part at token {first} although the sampler saw the same logits there")


def test_where_kernels_round_alike_a_drafted_reply_is_bit_identical(exact_engine, always_draft):
    """The strongest form of the oracle: with flash attention on one thread, this CPU build
    computes a check's logits bit for bit as one-by-one decoding does (elsewhere its kernels for
    several query tokens round differently), so any difference would be the speculation's own:
    a stale cell, a penalty window or a draw out of order. Greedy and seeded (there the engine
    drafts seeded turns too), the reply is the same token for token, drafts accepted and
    rejected alike."""
    prose = [{"role": "user", "content": "Describe a walk through a forest in autumn."}]
    assert exact_engine._runtime.exact_checks
    drafted = rejected = 0
    for sampling in (GREEDY, Sampling(temperature=0.7, seed=5, max_tokens=48)):
        for messages in (EDIT, prose):
            plain, _ = answer(exact_engine, "off", messages, sampling)
            tokens, done = answer(exact_engine, "ngram", messages, sampling)
            drafted += done.timings.draft_n
            rejected += done.timings.draft_n - done.timings.draft_n_accepted
            assert plain == tokens, (sampling, messages[0]["content"][:30])
    assert drafted > 40 and rejected > 5


def test_a_seeded_reply_is_not_drafted_and_stays_the_same(spec_engine):
    seeded = Sampling(temperature=0.7, seed=11, max_tokens=32)
    replies = []
    for mode in ("off", "ngram"):
        tokens, done = answer(spec_engine, mode, EDIT, seeded)
        replies.append(tokens)
        assert done.timings.draft_n == 0
    assert replies[0] == replies[1]


def test_rejected_drafts_leave_the_cache_exact_for_the_next_turn(spec_engine, fresh):
    prose = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
    tokens, done = reply_tokens(spec_engine.submit(prose, GREEDY))
    assert done.timings.draft_n > done.timings.draft_n_accepted  # some drafts were rejected
    assert spec_engine._runtime.max_position() + 1 == spec_engine.tokens_in_context
    history = prose + [{"role": "assistant", "content": done.reply},
                       {"role": "user", "content": "Now tell it again in two sentences."}]
    again, second = reply_tokens(spec_engine.submit(history, GREEDY))
    assert second.timings.cache_n >= len(tokens)  # the reply's cells were reused
    assert_matches_fresh(again[:24], fresh, history)


def test_a_stop_during_a_check_ends_the_reply_with_an_exact_cache(spec_engine, fresh):
    runtime = spec_engine._runtime
    decode = runtime.decode
    handle = None
    checks = []

    def stopping(tokens, start_pos, abortable=False, outputs=1):
        if outputs > 1 and handle is not None:
            checks.append(len(tokens))
            handle.stop()  # the stop arrives while the check is being decoded
        return decode(tokens, start_pos, abortable, outputs)

    runtime.decode = stopping
    try:
        handle = spec_engine.submit(EDIT, Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=200))
        final = handle.wait(60)
    finally:
        runtime.decode = decode
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert checks and final.timings.predicted_n <= 200
    assert runtime.max_position() + 1 == spec_engine.tokens_in_context
    history = EDIT + [{"role": "assistant", "content": final.reply},
                      {"role": "user", "content": "Thanks. Now in capitals?"}]
    tokens, _ = reply_tokens(spec_engine.submit(history, GREEDY))
    assert_matches_fresh(tokens[:24], fresh, history)


def test_the_test_model_drafting_for_itself_accepts_nearly_every_draft(test_model_path, fresh):
    with loaded_engine(test_model_path, 2048, "self-draft", speculative="draft",
                       draft_model=str(test_model_path)) as engine:
        assert engine.speculation == f"draft {test_model_path.stem}"
        tokens, done = reply_tokens(engine.submit(EDIT, GREEDY))
        timings = done.timings
        assert timings.draft_n >= 16
        assert timings.draft_n_accepted >= 0.9 * timings.draft_n
        assert_matches_fresh(tokens, fresh, EDIT)
        assert engine._runtime.max_position() + 1 == engine.tokens_in_context


def test_a_draft_model_with_another_vocabulary_is_refused_in_one_line(test_model_path, synthetic_model):
    other = synthetic_model("llama-tiny-othervocab")
    with loaded_engine(test_model_path, 512, "target", speculative="auto",
                       draft_model=str(other)) as engine:
        assert engine.speculation == "ngram"  # the chat goes on, drafting by prompt lookup
        events = list(engine.submit([{"role": "user", "content": "Hi!"}], GREEDY))
        notices = [e.message for e in events if isinstance(e, Notice)]
        assert len(notices) == 1 and "\n" not in notices[0]
        assert other.stem in notices[0] and "target" in notices[0]
        assert "another vocabulary (token 17 differs)" in notices[0]
        assert isinstance(events[-1], Done) and events[-1].finish_reason in ("stop", "length")
        assert any(isinstance(e, Token) for e in events)
        # Said once, not at every turn.
        assert not [e for e in engine.submit([{"role": "user", "content": "Hi!"}], GREEDY)
                    if isinstance(e, Notice)]


def test_ask_summary_shows_the_drafts():
    from localchat.commands.ask_output import summary_line

    line = summary_line(Timings(predicted_n=40, predicted_ms=1000.0, draft_n=30, draft_n_accepted=24))
    assert "drafted 30, 24 accepted (80%)" in line
    assert "drafted" not in summary_line(Timings(predicted_n=40, predicted_ms=1000.0))


def test_the_shipped_prompt_set_reads_and_a_bad_line_is_one_error(tmp_path):
    from localchat.bench.speculative import read_set, shipped_set
    from localchat.errors import UserError

    kinds = {kind for kind, _ in read_set(shipped_set())}
    assert kinds == {"edit", "prose"}
    bad = tmp_path / "set.jsonl"
    bad.write_text('{"kind": "edit", "prompt": "x"}\n{"kind": "poem", "prompt": "y"}\n')
    with pytest.raises(UserError, match=r"set.jsonl:2: kind must be edit or prose"):
        read_set(bad)


def test_models_toml_pairs_a_draft_model_only_once_it_is_downloaded():
    from localchat.engine.factory import engine_options
    from localchat.models.registry import load_registry, local_path
    from localchat.settings import EngineSection, Settings

    registry = load_registry()
    target = registry["smollm2-1.7b"]
    assert target.draft == "smollm2-135m"
    assert engine_options(target, Settings()).draft_model is None  # not downloaded: no draft
    draft_file = local_path(registry["smollm2-135m"])
    draft_file.parent.mkdir(parents=True, exist_ok=True)
    draft_file.touch()
    assert engine_options(target, Settings()).draft_model == "smollm2-135m"
    configured = Settings(engine=EngineSection(draft_model="my-draft"))
    assert engine_options(target, configured).draft_model == "my-draft"
    assert engine_options(target, configured, draft_model="flag").draft_model == "flag"
