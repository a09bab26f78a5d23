"""The rules that send a prompt to the remote before local generation, and their calibration."""

from __future__ import annotations

import json

import pytest

from localchat.errors import UserError
from localchat.remote.router import LABEL_LOCAL, LABEL_REMOTE, LABELLED_PROMPTS, decide, evaluate
from localchat.remote.settings import RouterThresholds

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
