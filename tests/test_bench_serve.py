"""``bench --serve``'s parts that decide its numbers: the streamed request it times (against a real
serve) and the targets it checks; the whole bench runs minutes and is run by hand."""

from __future__ import annotations

import httpx
import pytest
from serve_fixtures import MODEL, running

from localchat.bench.serve import concurrent, serve_targets
from localchat.bench.serve_clients import stream_chat


@pytest.mark.model
def test_a_timed_stream_reads_ttft_tokens_and_the_cached_share_serve_reports(serve_host):
    with running(serve_host) as app, httpx.Client(timeout=60) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 5, "temperature": 0}
        first = stream_chat(client, app.base_url, body)
        again = stream_chat(client, app.base_url, body)
        many = concurrent(app.base_url, MODEL, 3)

    assert first.complete and first.ttft_ms > 0 and first.completion_tokens == 5
    assert again.cached_tokens == again.prompt_tokens - 1 == first.prompt_tokens - 1
    assert many == {"clients": 3, "complete": 3, "errors": 0, "in_order": True}


def test_the_targets_read_the_report():
    def turn(ttft: float) -> dict:
        return {"ttft_ms": ttft, "cached_share_min": 0.99, "decode_tps": 80, "errors": 0}

    rows = [[{"cached_share": None}]] + [[{"cached_share": 0.97}, {"cached_share": 0.99}]] * 9
    report = {
        "servers": {"localchat serve": {"turns": [turn(100)] * 9 + [turn(125)], "requests": rows,
                                        "median_ttft_ms": 100},
                    "llama-cpp-python": {"median_ttft_ms": 400}},
        "http_overhead": {"ttft_minus_in_process_ms": 12.0, "decode_ratio": 0.97},
        "concurrent": {"localchat serve": {"clients": 16, "complete": 16, "errors": 0,
                                           "in_order": True}}}

    checks = {c["target"]: c for c in serve_targets(report)}

    assert checks["turn >= 2: cached / previous prompt + reply (min)"]["value"] == 0.97
    assert checks["TTFT turn 10 / turn 2 (median over conversations)"]["value"] == 1.25
    assert checks["median TTFT / llama-cpp-python's"]["value"] == 0.25
    assert not checks["TTFT through serve - in process (ms, median)"]["ok"]  # 12 ms > 10
    assert all(c["ok"] for name, c in checks.items() if "- in process" not in name)
