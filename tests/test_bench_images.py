"""``bench --images``: one round on the real model with its colour-words projector (the numbers
the closing note quotes come from the same code), and the targets on made-up summaries."""

from __future__ import annotations

import pytest

from localchat.bench.images import image_targets, measure_images
from localchat.engine.vision import image_support


@pytest.mark.model
@pytest.mark.skipif(not image_support().available, reason="no libmtmd in this build")
def test_a_round_keeps_the_picture_and_restores_it_without_encoding(test_model_path):
    report = measure_images(test_model_path, "smollm2-135m", n_ctx=1024, rounds=1, max_tokens=8)
    row, summary = report["rounds"][0], report["summary"]
    assert row["turn1"]["images_n"] == 1 and row["turn1"]["image_ms"] > 0
    assert summary["turn2_images_n"] == 0 and summary["turn2_reuse_min"] == 1.0
    assert summary["restored_images_n"] == 0 and summary["restored_same_reply"]
    assert row["restored"]["cache_n"] >= row["warm"]["cache_n"]


def test_the_targets_read_the_summary():
    summary = {"turn2_images_n": 1, "turn2_reuse_min": 0.9, "restored_images_n": 0,
               "restored_ttft_ms": 300.0, "warm_ttft_ms": 100.0}
    checks = {c["target"]: c["ok"] for c in image_targets(summary)}
    assert list(checks.values()) == [False, False, True, False]
