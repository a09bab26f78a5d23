"""``localchat bench --router``: the rules' scores, and the whole route through the real local
model — precision, recall, easy prompts kept local, late escalations, local tokens wasted."""

from __future__ import annotations

import json

import pytest
from heavy_imports import heavy_modules_loaded_by

from localchat.bench.router import LABEL_LOCAL, LABEL_REMOTE, score
from localchat.cli import main
from localchat.remote.escalate import TurnOutcome
from localchat.remote.router import LABELLED_PROMPTS

HOLDOUT = LABELLED_PROMPTS.with_name("router_holdout.jsonl")


def bench(capsys, *args: str) -> tuple[int, dict | str, str]:
    code = main(["bench", "--router", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and "--json" in args else out), err


def test_scores_count_late_escalations_and_the_local_tokens_each_one_wasted():
    rows = [
        ("hard, by the rules", LABEL_REMOTE, TurnOutcome("remote", "auto: rules", escalated=True)),
        ("hard, early", LABEL_REMOTE, TurnOutcome("remote", "auto: low-confidence", escalated=True,
                                                  local_partial="um", local_tokens=16)),
        ("hard, late", LABEL_REMOTE, TurnOutcome("remote", "auto: late, after 80 local tokens: loop",
                                                 escalated=True, local_partial="x", local_tokens=80,
                                                 late=True)),
        ("hard, missed", LABEL_REMOTE, TurnOutcome("local", "local: no features")),
        ("easy, kept", LABEL_LOCAL, TurnOutcome("local", "local: no features")),
        ("easy, sent", LABEL_LOCAL, TurnOutcome("remote", "auto: loop", escalated=True,
                                                local_partial="y", local_tokens=30)),
    ]
    report = score(rows)
    assert (report["tp"], report["fp"], report["fn"], report["tn"]) == (3, 1, 1, 1)
    assert report["recall"] == 0.75 and report["precision"] == 0.75 and report["easy_kept_local"] == 0.5
    assert report["escalated_by_rules"] == 1 and report["escalated_within_64_tokens"] == 2
    assert report["late_escalations"] == report["late_escalations_of_hard_prompts"] == 1
    assert report["tokens_wasted_per_escalation"] == (0 + 16 + 80 + 30) / 4
    assert report["tokens_wasted_max"] == 80
    assert [m["prompt"] for m in report["misrouted"]] == ["hard, missed", "easy, sent"]


def test_rules_only_uses_the_threshold_of_the_named_models_size(capsys, test_model_path):
    code, report, _ = bench(capsys, str(HOLDOUT), "--rules-only", "-m", str(test_model_path), "--json")
    assert code == 0 and report["n_params"] == 134_515_008
    rules = report["rules"]
    assert rules["threshold"] == 1.75 and rules["n"] >= 40
    assert rules["recall"] >= 0.8 and rules["easy_kept_local"] >= 0.9


def test_a_bad_labelled_file_is_one_line_and_exit_1(capsys, tmp_path):
    bad = tmp_path / "set.jsonl"
    bad.write_text('{"prompt": "hi"}\n')
    code, _, err = bench(capsys, str(bad), "--rules-only")
    assert code == 1 and err.startswith("localchat: error:") and err.count("\n") == 1
    assert "Traceback" not in err


def test_scoring_the_rules_alone_loads_neither_llama_cpp_nor_the_http_client(isolated_home):
    loaded, _ = heavy_modules_loaded_by(["bench", "--router", "--rules-only", "--json"], isolated_home)
    assert loaded == []


@pytest.mark.model
def test_the_whole_route_on_the_held_out_set_meets_the_issue_targets(capsys, test_model_path):
    # 72 tokens: room for an escalation after 64 local tokens to show up as late.
    code, report, _ = bench(capsys, str(HOLDOUT), "-m", str(test_model_path), "--max-tokens", "72",
                            "--json")
    assert code == 0
    route = report["route"]
    hard = route["tp"] + route["fn"]
    assert route["recall"] >= 0.8 and route["easy_kept_local"] >= 0.9
    assert route["late_escalations_of_hard_prompts"] <= hard / 10
    # The rules decide the hard ones before any local token; the monitor within its window.
    assert route["escalated_by_rules"] >= 0.8 * hard
    assert route["tokens_wasted_per_escalation"] <= 32
    assert report["rules"]["mean_latency_ms"] > 0
