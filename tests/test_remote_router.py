"""The rules that send a prompt to the remote before local generation, and their calibration."""

from __future__ import annotations

import json

import pytest

from localchat.bench.router import LABEL_LOCAL, LABEL_REMOTE, evaluate
from localchat.errors import UserError
from localchat.remote.router import LABELLED_PROMPTS, decide, rule_score_for
from localchat.settings.remote import RouterThresholds

PROMPTS = LABELLED_PROMPTS


@pytest.mark.parametrize("prompt", [
    "What is the capital of France?",
    "Tell me a short joke about cats.",
    "Translate 'good morning' into Spanish.",
])
def test_simple_prompts_stay_local(prompt):
    decision = decide(prompt)
    assert not decision.escalate
    assert decision.reason.startswith("no hard-task features")


@pytest.mark.parametrize("prompt, feature", [
    ("Prove by induction that the sum of the first n odd numbers is n^2.", "proof or derivation"),
    ("Solve step by step: if 3x + 5 = 20 and y = 2x, what is y? Show your work.",
     "step-by-step reasoning"),
    ("Implement a thread-safe LRU cache in Python and explain its time complexity.",
     "code to write or fix"),
])
def test_hard_task_features_escalate_and_are_named_in_the_reason(prompt, feature):
    decision = decide(prompt)
    assert decision.escalate
    assert feature in decision.reason and feature in decision.features


def test_a_prompt_that_does_not_fit_the_local_room_escalates_whatever_it_says():
    decision = decide("hello " * 10, local_room_tokens=100, prompt_tokens=150)
    assert decision.escalate and "does not fit" in decision.reason
    assert not decide("hello", local_room_tokens=100, prompt_tokens=50).escalate


def test_the_threshold_is_the_users():
    prompt = "Implement a thread-safe LRU cache in Python and explain its time complexity."
    assert not decide(prompt, RouterThresholds(rule_score=10)).escalate


def test_the_labelled_set_is_large_enough_and_balanced():
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    labels = [row["label"] for row in rows]
    assert len(rows) >= 60
    assert labels.count(LABEL_LOCAL) >= 25 and labels.count(LABEL_REMOTE) >= 25


def test_evaluation_reports_precision_recall_and_latency():
    report = evaluate(PROMPTS)
    assert report["n"] == report["tp"] + report["fp"] + report["fn"] + report["tn"]
    # The calibration this project ships with: the rules rarely send an easy prompt away
    # (escalating costs money and privacy) and catch most prompts that need it; the rest is the
    # confidence monitor's job.
    assert report["precision"] >= 0.9
    assert report["recall"] >= 0.7
    assert report["max_latency_ms"] >= report["mean_latency_ms"] > 0
    assert len(report["misrouted"]) == report["fp"] + report["fn"]


def test_a_malformed_labelled_file_is_a_user_error(tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "hi", "label": "maybe"}\n')
    with pytest.raises(UserError, match="label"):
        evaluate(bad)


# -- the grounded rule set, and the threshold from the local model's size ----------------------

HOLDOUT = LABELLED_PROMPTS.with_name("router_holdout.jsonl")
SMOLLM2_135M = 134_515_008  # the test model's parameter count, from its GGUF tensor table


@pytest.mark.parametrize("prompt, feature", [
    ("Solve: a train leaves at 9:00 at 80 km/h and a second one at 10:30 at 120 km/h on the same "
     "track. At what time does the second catch up?", "multi-step math"),
    ("Explain, with a worked numerical example, how compound interest grows a deposit.",
     "step-by-step reasoning"),
    ("Draft a legal-style contract clause that limits a vendor's liability to the fees paid.",
     "a document to draft"),
    ("Write a 1,500-word report on urban heat islands with an executive summary and headings.",
     "long structured document"),
])
def test_task_features_of_the_issue_escalate_for_the_test_model(prompt, feature):
    decision = decide(prompt, local_params=SMOLLM2_135M)
    assert decision.escalate and feature in decision.features


@pytest.mark.parametrize("prompt", [
    "What is 9 times 7?",  # numbers, but one step
    "In one sentence, what is a contract?",  # a legal word, but no drafting
    "How many minutes are in two hours?",  # a question to compute, but no quantities to combine
])
def test_a_single_feature_word_does_not_make_an_easy_prompt_hard(prompt):
    assert not decide(prompt, local_params=SMOLLM2_135M).escalate


def test_the_threshold_rises_with_the_local_models_parameter_count():
    thresholds = RouterThresholds()
    small, mid, large = (rule_score_for(thresholds, n) for n in (SMOLLM2_135M, 1e9, 8e9))
    assert small < mid < large
    assert rule_score_for(thresholds, None) == 2.0  # unknown size: the old fixed threshold
    # The user's own rule_score wins over the size.
    assert rule_score_for(RouterThresholds(rule_score=2.5), SMOLLM2_135M) == 2.5
    assert "< 3.17" in decide("Prove that there are infinitely many primes, please.",
                              local_params=8e9).reason


def test_the_holdout_set_is_disjoint_from_the_shipped_one_and_balanced():
    def prompts(path):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    holdout, shipped = prompts(HOLDOUT), prompts(PROMPTS)
    assert len(holdout) >= 40
    assert not {r["prompt"] for r in holdout} & {r["prompt"] for r in shipped}
    labels = [r["label"] for r in holdout]
    assert labels.count(LABEL_LOCAL) >= 20 and labels.count(LABEL_REMOTE) >= 20


def test_on_the_holdout_set_the_rules_for_the_test_model_meet_the_issue_targets():
    report = evaluate(HOLDOUT, local_params=SMOLLM2_135M)
    assert report["recall"] >= 0.8 and report["easy_kept_local"] >= 0.9
    assert report["threshold"] == rule_score_for(RouterThresholds(), SMOLLM2_135M)
