"""``bench --serve --concurrent C``: its command line, the summary and targets it makes of the
requests (on made-up numbers) and the streamed completion it times; the whole bench starts
servers and runs minutes, and is run by hand."""

from __future__ import annotations

import httpx
import pytest
from serve_fixtures import MODEL, running

from localchat.bench.serve_clients import Answer, stream_completion
from localchat.bench.serve_concurrent import completion_body, fresh_prompt, probe_streams, refused
from localchat.bench.serve_concurrent_report import (
    concurrent_targets,
    local_name,
    print_concurrent,
    refusal_notes,
    summarise,
)
from localchat.cli import main


@pytest.mark.parametrize("argv, message", [
    (["bench", "--concurrent", "4"], "--concurrent goes with --serve"),
    (["bench", "--router", "--concurrent", "4"], "--concurrent goes with --serve"),
    (["bench", "--serve", "--concurrent", "1"], "--concurrent must be at least 2"),
    (["bench", "--serve", "--concurrent", "4", "--clients", "8"],
     "--clients goes with --serve without --concurrent"),
    (["bench", "--serve", "--concurrent", "4", "--rounds", "2"],
     "--rounds goes with --serve without --concurrent"),
])
def test_flags_that_do_not_go_with_concurrent_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"localchat: error: {message}") and err.count("\n") == 1


def test_the_probe_leaves_a_slot_for_its_completion():
    assert [probe_streams(c) for c in (2, 3, 4, 8)] == [1, 2, 3, 3]


def test_a_refused_kind_is_a_4xx_or_501_not_a_failure():
    assert refused(Answer(status=501)) and refused(Answer(status=404))
    assert not refused(Answer(status=500)) and not refused(Answer(status=None))


def test_probe_prompts_start_apart_in_each_round_and_run_and_are_the_same_length():
    alone, probe = fresh_prompt("alone", "abc123", 0), fresh_prompt("probe", "abc123", 0)
    assert alone != probe and len(alone) == len(probe)
    assert fresh_prompt("alone", "abc123", 1) != alone != fresh_prompt("alone", "def456", 0)
    assert alone.split("\n", 1)[1] == probe.split("\n", 1)[1]
    assert completion_body("m", alone)["temperature"] == 0


def _row(ttft: float | None, tokens: int = 48, tps: float | None = 100.0,
         error: str | None = None, **extra) -> dict:
    return {"ttft_ms": ttft, "completion_tokens": tokens, "decode_tps": tps, "status": 200,
            "error": error, **extra}


def _run(chat_ttft: list[float], wall_s: float, single_tps: float, alone: float, during: float,
         *, completions: bool = True, embeddings: bool = True) -> dict:
    """A server's requests: two chat clients of len(chat_ttft)/2 turns, 48 tokens each."""
    half = len(chat_ttft) // 2
    typed = ({"refused": None, "requests": [_row(t, 16) for t in (10, 20, 30, 200)]} if completions
             else {"refused": "HTTP 404: not found", "requests": []})
    embedded = ({"latency_ms": 900.0, "status": 200, "vectors": 64, "refused": None, "error": None}
                if embeddings else {"latency_ms": 3.0, "status": 501, "vectors": 0,
                                    "refused": "HTTP 501: start it with --embeddings", "error": None})
    return {"under_load": {"wall_s": wall_s, "chats": [[_row(t) for t in chat_ttft[:half]],
                                                       [_row(t) for t in chat_ttft[half:]]],
                           "completions": typed, "embeddings": embedded},
            "alone": [_row(50, tps=single_tps), _row(60, tps=single_tps + 2), _row(None, 0, None, "x")],
            "completion_alone": [_row(alone, 16, refused=None)] * 3,
            "completion_during_streams": [_row(during, 16, refused=None, streams_active=3)] * 3}


def test_the_summary_times_each_kind_apart():
    run = _run([100, 200, 300, 400], wall_s=2.0, single_tps=120, alone=40, during=70)
    run["under_load"]["chats"][1].append(_row(None, 0, None, "HTTP 503"))

    s = summarise(run)

    assert (s["chat_requests"], s["chat_errors"], s["chat_tokens"]) == (5, 1, 192)
    assert s["chat_ttft_p50_ms"] == 250.0 and s["chat_ttft_p90_ms"] == 370.0
    assert s["aggregate_tps"] == 96.0  # 4 x 48 tokens over 2 s of wall time
    assert (s["completion_ttft_p50_ms"], s["completion_ttft_p90_ms"]) == (25.0, 149.0)
    assert s["embeddings_latency_ms"] == 900.0 and s["embeddings_supported"]
    assert s["single_client_tps"] == 121.0  # the failed turn is left out
    assert (s["completion_alone_ttft_ms"], s["completion_during_streams_ttft_ms"]) == (40, 70)


def test_a_kind_a_server_refuses_is_not_supported_and_noted():
    run = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70, completions=False,
               embeddings=False)
    run["summary"] = summarise(run)
    assert not run["summary"]["completion_supported"] and not run["summary"]["embeddings_supported"]
    assert run["summary"]["embeddings_latency_ms"] is None

    notes = refusal_notes({"probe_streams": 3, "servers": {"http://x": run}})

    assert len(notes) == 2 and "HTTP 404" in notes[0] and "--embeddings" in notes[1]


def _report(servers: dict) -> dict:
    for run in servers.values():
        run["summary"] = summarise(run)
    report = {"model": "smollm2", "n_ctx": 4096, "clients": 4, "turns": 3, "max_tokens": 48,
              "typing_requests": 8, "typing_max_tokens": 16, "embedding_inputs": 64,
              "probe_streams": 3, "probe_rounds": 3, "servers": servers, "notes": []}
    report["targets"] = concurrent_targets(report)
    return report


def test_the_targets_compare_parallel_slots_with_one_slot_and_llama_server():
    report = _report({
        local_name(4): _run([100, 200, 300, 400], wall_s=2.0, single_tps=96, alone=40, during=70),
        local_name(1): _run([100, 900, 1500, 2000], wall_s=2.4, single_tps=100, alone=40, during=900),
        "http://127.0.0.1:18080": _run([120, 250, 290, 500], wall_s=2.0, single_tps=150, alone=30,
                                       during=50)})

    checks = {c["target"]: c for c in report["targets"]}

    assert checks["4 concurrent chat clients: TTFT p50 / llama-server -np 4's"]["value"] == 0.926
    assert checks["4 concurrent chat clients: TTFT p90 / llama-server -np 4's"]["ok"]  # 370 / 437
    assert checks["chat tokens/s, all 4 streams / llama-server -np 4's"]["value"] == 1.0
    assert checks["chat tokens/s, all 4 streams / --parallel 1's"]["value"] == 1.2  # 96 / 80
    assert checks["completion TTFT while 3 chats stream / alone (median)"]["value"] == 1.75
    one = checks["one client alone: decode tokens/s / --parallel 1's"]
    assert one["value"] == 0.96 and one["ok"]  # 97 / 101
    assert all(c["ok"] for c in report["targets"])


def test_without_llama_server_its_targets_are_not_measured_rather_than_missed(capsys):
    report = _report({
        local_name(4): _run([100, 200], wall_s=1.0, single_tps=90, alone=40, during=100),
        local_name(1): _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=900)})

    unmeasured = [c for c in report["targets"] if c["ok"] is None]
    assert [c["target"] for c in unmeasured] == [
        "4 concurrent chat clients: TTFT p50 / llama-server -np 4's",
        "4 concurrent chat clients: TTFT p90 / llama-server -np 4's",
        "chat tokens/s, all 4 streams / llama-server -np 4's"]
    assert {c["value"] for c in unmeasured} == {"not measured"}
    missed = {c["target"] for c in report["targets"] if c["ok"] is False}
    assert missed == {"chat tokens/s, all 4 streams / --parallel 1's",  # 1.0 < 1.1
                      "completion TTFT while 3 chats stream / alone (median)",  # 2.5 > 2
                      "one client alone: decode tokens/s / --parallel 1's"}  # 0.9 < 0.95

    print_concurrent(report)
    out = capsys.readouterr().out
    assert "localchat serve --parallel 4" in out and "chat TTFT p50 / p90 (ms)" in out
    assert "[--] 4 concurrent chat clients: TTFT p50" in out and "[MISS] one client alone" in out


@pytest.mark.model
def test_a_streamed_completion_is_timed_and_calls_back_once(serve_host):
    firsts = []
    with running(serve_host) as app, httpx.Client(timeout=60) as client:
        answer = stream_completion(client, app.base_url,
                                   {**completion_body(MODEL, fresh_prompt("alone", "abc123", 0)),
                                    "max_tokens": 4}, lambda: firsts.append(1))

    assert answer.complete and answer.status == 200 and answer.text
    assert answer.completion_tokens == 4 and answer.ttft_ms > 0 and firsts == [1]
