"""``bench --serve --concurrent C``: its command line, the summary and targets it makes of the
requests (on made-up numbers), the streamed completion it times, and its typist's ``/infill``
requests and embeddings alone on a real server (over the test model with fill-in-the-middle
tokens, tests/fim_model.py); the whole bench starts servers and runs minutes, and is run by hand."""

from __future__ import annotations

import httpx
import pytest
from fim_model import with_fim_tokens
from serve_fixtures import MODEL, running, serving

from localchat.bench import serve_concurrent
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

FIM_MODEL = "smollm2-fim"


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


def _typed_fim(ttft: list[float], prompt: list[int], prefilled: list[int]) -> dict:
    """A typist's /infill requests in one round, their TTFT and prompt tokens (in all, and
    prefilled)."""
    return {"refused": None, "rounds": [[
        _row(t, 2, prompt_tokens=n, prefilled_tokens=p, cached_tokens=n - p)
        for t, n, p in zip(ttft, prompt, prefilled, strict=True)]]}


def _embedded_alone(latency_ms: list[float], tokens: int | None = 3200) -> dict:
    return {"refused": None, "rounds": [
        {"latency_ms": ms, "status": 200, "vectors": 64, "tokens": tokens, "refused": None,
         "error": None} for ms in latency_ms]}


REFUSED_INFILL = {"refused": "HTTP 501: infill is not supported", "rounds": [[]]}
REFUSED_EMBEDDINGS = {"refused": "HTTP 501: start it with --embeddings", "rounds": [
    {"latency_ms": 3.0, "status": 501, "vectors": 0, "tokens": None,
     "refused": "HTTP 501: start it with --embeddings", "error": None}]}


def _run(chat_ttft: list[float], wall_s: float, single_tps: float, alone: float, during: float,
         *, completions: bool = True, embeddings: bool = True, fim_ttft: float = 100.0,
         embedding_ms: float = 1000.0) -> dict:
    """A server's requests: two chat clients of len(chat_ttft)/2 turns, 48 tokens each; a typist's
    /infill requests (median TTFT of 2..N ``fim_ttft``) and embeddings alone (64 inputs in
    ``embedding_ms`` after a first round twice as long)."""
    half = len(chat_ttft) // 2
    typed = ({"refused": None, "requests": [_row(t, 16) for t in (10, 20, 30, 200)]} if completions
             else {"refused": "HTTP 404: not found", "requests": []})
    embedded = ({"latency_ms": 900.0, "status": 200, "vectors": 64, "refused": None, "error": None}
                if embeddings else {"latency_ms": 3.0, "status": 501, "vectors": 0,
                                    "refused": "HTTP 501: start it with --embeddings", "error": None})
    def chats() -> list:
        return [[_row(t) for t in chat_ttft[:half]], [_row(t) for t in chat_ttft[half:]]]

    return {"chats_only": {"wall_s": wall_s, "chats": chats()},
            "under_load": {"wall_s": wall_s, "chats": chats(),
                           "completions": typed, "embeddings": embedded},
            "alone": [_row(50, tps=single_tps), _row(60, tps=single_tps + 2), _row(None, 0, None, "x")],
            "completion_alone": [_row(alone, 16, refused=None)] * 3,
            "completion_during_streams": [_row(during, 16, refused=None, streams_active=3)] * 3,
            "typing_fim": _typed_fim([5 * fim_ttft, fim_ttft - 10, fim_ttft, fim_ttft + 10],
                                     [88, 89, 91, 92], [88, 30, 31, 30])
            if completions else REFUSED_INFILL,
            "embeddings_alone": _embedded_alone([2 * embedding_ms, embedding_ms, embedding_ms])
            if embeddings else REFUSED_EMBEDDINGS}


def test_the_summary_times_each_kind_apart():
    run = _run([100, 200, 300, 400], wall_s=2.0, single_tps=120, alone=40, during=70)
    run["under_load"]["chats"][1].append(_row(None, 0, None, "HTTP 503"))

    s = summarise(run)

    assert (s["chat_requests"], s["chat_errors"], s["chat_tokens"]) == (5, 1, 192)
    assert s["chat_ttft_p50_ms"] == 250.0 and s["chat_ttft_p90_ms"] == 370.0
    assert s["aggregate_tps"] == 96.0  # 4 x 48 tokens over 2 s of wall time
    assert (s["chats_only_requests"], s["chats_only_tps"]) == (4, 96.0)
    assert (s["completion_ttft_p50_ms"], s["completion_ttft_p90_ms"]) == (25.0, 149.0)
    assert s["embeddings_latency_ms"] == 900.0 and s["embeddings_supported"]
    assert s["single_client_tps"] == 121.0  # the failed turn is left out
    assert (s["completion_alone_ttft_ms"], s["completion_during_streams_ttft_ms"]) == (40, 70)


def test_fim_typing_is_summed_up_over_the_requests_after_the_first():
    run = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70)
    run["typing_fim"] = _typed_fim([900, 100, 130, 120, 110], [88, 89, 90, 92, 93],
                                   [88, 30, 30, 31, 30])

    s = summarise(run)

    assert s["fim_supported"] and (s["fim_requests"], s["fim_errors"]) == (5, 0)
    assert (s["fim_first_ttft_ms"], s["fim_ttft_p50_ms"]) == (900, 115.0)
    assert s["fim_prefilled"] == [88, 30, 30, 31, 30] and s["fim_prefilled_p50"] == 30
    # Each prefilled what its prompt grew by (1, 1, 2, 1 tokens) and the same 29-token tail.
    assert s["fim_beyond_new_p50"] == 29


def test_fim_typing_rounds_are_summed_up_together_each_without_its_first_request():
    run = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70)
    first = _typed_fim([900, 100, 130], [88, 89, 90], [88, 30, 30])["rounds"][0]
    second = _typed_fim([700, 140, 150], [88, 89, 91], [88, 30, 31])["rounds"][0]
    run["typing_fim"] = {"refused": None, "rounds": [first, second]}

    s = summarise(run)

    assert (s["fim_requests"], s["fim_first_ttft_ms"], s["fim_ttft_p50_ms"]) == (6, 800, 135.0)
    assert s["fim_prefilled"] == [88, 30, 30] and s["fim_beyond_new_p50"] == 29


def test_embeddings_alone_leave_the_warm_up_round_out():
    run = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70)
    run["embeddings_alone"] = _embedded_alone([2000.0, 1000.0, 500.0])

    s = summarise(run)

    assert s["embeddings_alone_supported"] and s["embeddings_alone_first_ms"] == 2000.0
    assert s["embeddings_alone_ms"] == 750.0
    assert s["embeddings_alone_inputs_per_s"] == 96.0  # the median of 64 and 128
    assert s["embeddings_alone_tokens_per_s"] == 4800.0  # 3200 tokens in 1 s and in 0.5 s


def test_one_embeddings_round_is_summed_up_alone_and_tokens_only_where_counted():
    run = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70)
    run["embeddings_alone"] = _embedded_alone([800.0], tokens=None)

    s = summarise(run)

    assert s["embeddings_alone_inputs_per_s"] == 80.0 and s["embeddings_alone_tokens_per_s"] is None


def test_a_kind_a_server_refuses_is_not_supported_and_noted():
    run = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70, completions=False,
               embeddings=False)
    run["summary"] = summarise(run)
    assert not run["summary"]["completion_supported"] and not run["summary"]["embeddings_supported"]
    assert run["summary"]["embeddings_latency_ms"] is None
    assert not run["summary"]["fim_supported"] and not run["summary"]["fim_skipped"]
    assert not run["summary"]["embeddings_alone_supported"]

    notes = refusal_notes({"probe_streams": 3, "servers": {"http://x": run}})

    assert len(notes) == 3 and "HTTP 404" in notes[0] and "--embeddings" in notes[1]
    assert notes[2] == "http://x does not answer /infill: HTTP 501: infill is not supported"


def _report(servers: dict) -> dict:
    for run in servers.values():
        run["summary"] = summarise(run)
    report = {"model": "smollm2", "n_ctx": 4096, "clients": 4, "turns": 3, "max_tokens": 48,
              "typing_requests": 8, "typing_max_tokens": 16, "embedding_inputs": 64,
              "rounds": 3,
              "probe_streams": 3, "probe_rounds": 3, "servers": servers, "notes": []}
    report["targets"] = concurrent_targets(report)
    return report


def test_the_targets_compare_parallel_slots_with_one_slot_and_llama_server():
    report = _report({
        local_name(4): _run([100, 200, 300, 400], wall_s=2.0, single_tps=96, alone=40, during=70,
                            fim_ttft=105, embedding_ms=900),
        local_name(1): _run([100, 900, 1500, 2000], wall_s=2.4, single_tps=100, alone=40, during=900),
        "http://127.0.0.1:18080": _run([120, 250, 290, 500], wall_s=2.0, single_tps=150, alone=30,
                                       during=50, fim_ttft=100, embedding_ms=1000)})

    checks = {c["target"]: c for c in report["targets"]}

    assert checks["4 concurrent chat clients: TTFT p50 / llama-server -np 4's"]["value"] == 0.926
    assert checks["4 concurrent chat clients: TTFT p90 / llama-server -np 4's"]["ok"]  # 370 / 437
    assert checks["4 concurrent chat clients: tokens/s, all streams / llama-server -np 4's"][
        "value"] == 1.0
    assert checks["4 concurrent chat clients: tokens/s, all streams / --parallel 1's"][
        "value"] == 1.2  # 96 / 80
    assert checks["completion TTFT while 3 chats stream / alone (median)"]["value"] == 1.75
    one = checks["one client alone: decode tokens/s / --parallel 1's"]
    assert one["value"] == 0.96 and one["ok"]  # 97 / 101
    fim = checks["typing with FIM (/infill): TTFT of requests 2..8 / llama-server's (median)"]
    assert fim["value"] == 1.05 and fim["limit"] == 1.1  # 105 / 100
    embed = checks["embeddings alone, 64 inputs: inputs/s / llama-server's"]
    assert embed["value"] == 1.111 and embed["limit"] == 1.0  # 71.1 / 64
    assert all(c["ok"] for c in report["targets"])


def test_fim_and_embeddings_against_a_server_that_refuses_them_are_not_measured(capsys):
    report = _report({
        local_name(4): _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70),
        local_name(1): _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70),
        "http://127.0.0.1:18081": _run([100, 200], wall_s=1.0, single_tps=100, alone=40,
                                       during=70, completions=False, embeddings=False)})

    checks = {c["target"]: c for c in report["targets"]}

    fim = checks["typing with FIM (/infill): TTFT of requests 2..8 / llama-server's (median)"]
    embed = checks["embeddings alone, 64 inputs: inputs/s / llama-server's"]
    assert fim["ok"] is None and fim["value"] == "not measured (llama-server does not answer /infill)"
    assert embed["ok"] is None and "does not answer /v1/embeddings" in embed["value"]
    print_concurrent(report)
    out = capsys.readouterr().out
    assert "/infill typing: TTFT 1st / 2..N p50" in out and "not supported" in out
    assert f"/infill prompt tokens prefilled, request by request, {local_name(4)}: 88, 30, 31, 30" \
        in out


def test_a_model_without_fim_tokens_skips_typing_with_fim_everywhere():
    ours = _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70)
    ours["typing_fim"] = {"refused": "HTTP 400: smollm2 has no fill-in-the-middle tokens",
                          "rounds": [[]]}
    skipped = {"refused": None, "skipped": ours["typing_fim"]["refused"], "rounds": []}
    report = _report({
        local_name(4): ours,
        local_name(1): {**_run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70),
                        "typing_fim": skipped},
        "http://x": {**_run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=70),
                     "typing_fim": skipped}})

    fim = next(c for c in report["targets"] if c["target"].startswith("typing with FIM"))

    assert fim["ok"] is None and "does not answer /infill for this model" in fim["value"]
    assert report["servers"]["http://x"]["summary"]["fim_skipped"]


def test_without_llama_server_its_targets_are_not_measured_rather_than_missed(capsys):
    report = _report({
        local_name(4): _run([100, 200], wall_s=1.0, single_tps=90, alone=40, during=100),
        local_name(1): _run([100, 200], wall_s=1.0, single_tps=100, alone=40, during=900)})

    unmeasured = {c["target"]: c["value"] for c in report["targets"] if c["ok"] is None}
    assert unmeasured == {
        "4 concurrent chat clients: TTFT p50 / llama-server -np 4's": "not measured",
        "4 concurrent chat clients: TTFT p90 / llama-server -np 4's": "not measured",
        "4 concurrent chat clients: tokens/s, all streams / llama-server -np 4's": "not measured",
        "typing with FIM (/infill): TTFT of requests 2..8 / llama-server's (median)":
            "not measured (no --against server)",
        "embeddings alone, 64 inputs: inputs/s / llama-server's":
            "not measured (no --against server)"}
    missed = {c["target"] for c in report["targets"] if c["ok"] is False}
    assert missed == {"4 concurrent chat clients: tokens/s, all streams / --parallel 1's",  # 1.0
                      "completion TTFT while 3 chats stream / alone (median)",  # 2.5 > 2
                      "one client alone: decode tokens/s / --parallel 1's"}  # 0.9 < 0.95

    print_concurrent(report)
    out = capsys.readouterr().out
    assert "localchat serve --parallel 4" in out and "chats only: TTFT p50 / p90 (ms)" in out
    assert "[--] 4 concurrent chat clients: TTFT p50" in out and "[MISS] one client alone" in out


def test_every_chat_of_a_run_starts_with_the_run_so_no_earlier_run_is_in_a_cache(monkeypatch):
    sent: list[list[dict]] = []

    def stream_chat(client, url, body, on_first_text=None):
        sent.append([dict(m) for m in body["messages"]])
        return Answer(status=200, text="Fine.")

    monkeypatch.setattr(serve_concurrent, "stream_chat", stream_chat)
    work = serve_concurrent.Workload(1, 2, 8, run="abc123")
    serve_concurrent._chat_client("http://x", "m", "Alone 1", work)

    assert len(sent) == 2 and all(m[0]["content"].startswith("(Run abc123.) ") for m in sent)


def _side_by_side(monkeypatch, *, fim_refused: bool = False) -> tuple[list, dict]:
    """``side_by_side`` over three servers (ours, ours with one slot, an --against one that
    refuses embeddings), every request recorded as (phase, URL, label) instead of sent."""
    asked: list[tuple[str, str, str]] = []

    def chats(url, model, work, beside=True, who="Client"):
        asked.append(("chats", url, who))
        return {"wall_s": 2.0, "chats": [[_row(100.0)]] * work.clients}

    def typing(url, model, tag):
        asked.append(("typing", url, tag))
        if fim_refused and url != "http://c":
            return {"refused": "HTTP 400: no fill-in-the-middle tokens", "requests": []}
        return {"refused": None, "requests": [_row(90.0, 2)] * 3}

    def alone(url, model, label, work):
        asked.append(("alone", url, label))
        return [_row(50.0)] * work.turns

    def embed(url, model, inputs):
        asked.append(("embed", url, inputs[0].split(": ")[0]))
        refusal = "HTTP 501: start it with --embeddings" if url == "http://c" else None
        return {"latency_ms": 10.0, "status": 200, "vectors": 64, "tokens": None,
                "refused": refusal, "error": None}

    for name, fake in (("under_load", chats), ("_typing_fim", typing), ("_chat_client", alone),
                       ("_embed", embed)):
        monkeypatch.setattr(serve_concurrent, name, fake)
    monkeypatch.setattr(serve_concurrent, "SETTLE_S", 0.0)
    served = {local_name(4): ("http://a", "m"), local_name(1): ("http://b", "m"),
              "http://c": ("http://c", "m")}
    runs = {name: {"parallel": 1 if name != "http://c" else None} for name in served}
    serve_concurrent.side_by_side(served, runs, serve_concurrent.Workload(2, 3, 48, run="r1"),
                                  lambda line: None)
    return asked, runs


def test_side_by_side_every_server_takes_its_turn_round_by_round(monkeypatch):
    asked, runs = _side_by_side(monkeypatch)

    rounds = serve_concurrent.ROUNDS
    expected = []
    for r in range(1, rounds + 1):
        for url in ("http://a", "http://b", "http://c"):
            expected += [("chats", url, f"Chat-only client r1 {r}"), ("typing", url, f"r1 {r}"),
                         ("alone", url, f"Alone {r}")]
            if url != "http://c" or r == 1:  # a server that refused embeddings is not asked again
                expected.append(("embed", url, f"Note 1 (alone, run r1, round {r})"))
    assert asked == expected
    ours = runs[local_name(4)]
    assert ours["chats_only"] == {"wall_s": 2.0 * rounds, "chats": [[_row(100.0)]] * 2 * rounds}
    assert len(ours["typing_fim"]["rounds"]) == rounds and len(ours["alone"]) == 3 * rounds
    assert len(ours["embeddings_alone"]["rounds"]) == rounds
    theirs = runs["http://c"]["embeddings_alone"]
    assert theirs["refused"] and len(theirs["rounds"]) == 1


def test_side_by_side_a_model_localchat_cannot_fill_in_is_typed_at_once_and_skipped_after(
        monkeypatch):
    asked, runs = _side_by_side(monkeypatch, fim_refused=True)

    assert [a for a in asked if a[0] == "typing"] == [("typing", "http://a", "r1 1")]
    assert runs[local_name(4)]["typing_fim"]["refused"]
    assert runs["http://c"]["typing_fim"]["skipped"] == runs[local_name(4)]["typing_fim"]["refused"]


@pytest.mark.model
def test_a_streamed_completion_is_timed_and_calls_back_once(serve_host):
    firsts = []
    with running(serve_host) as app, httpx.Client(timeout=60) as client:
        answer = stream_completion(client, app.base_url,
                                   {**completion_body(MODEL, fresh_prompt("alone", "abc123", 0)),
                                    "max_tokens": 4}, lambda: firsts.append(1))

    assert answer.complete and answer.status == 200 and answer.text
    assert answer.completion_tokens == 4 and answer.ttft_ms > 0 and firsts == [1]


@pytest.fixture(scope="module")
def fim_server(test_model_path):
    with serving(with_fim_tokens(test_model_path, test_model_path.parent / "fim"),
                 FIM_MODEL) as app:
        yield app


@pytest.mark.model
def test_each_typed_infill_prefills_only_the_new_characters_and_the_tail(fim_server):
    typing = serve_concurrent._typing_fim(fim_server.base_url, FIM_MODEL, "abc123")

    rows = typing["requests"]
    assert typing["refused"] is None and len(rows) == serve_concurrent.TYPING_REQUESTS
    assert all(row["error"] is None and row["ttft_ms"] > 0 for row in rows)
    # The first prefills its prompt but the lead (BOS, repo and file name) another typist left.
    assert rows[0]["prefilled_tokens"] >= 0.75 * rows[0]["prompt_tokens"]
    # After the first, each evaluates what its prompt grew by, and again the same tail after the
    # prefix (fim_suf, the suffix, fim_mid), +1 where the new characters re-tokenize the old last.
    beyond = [row["prefilled_tokens"] - (row["prompt_tokens"] - before["prompt_tokens"])
              for before, row in zip(rows, rows[1:])]
    assert max(beyond) - min(beyond) <= 1 and max(beyond) < rows[0]["prompt_tokens"] / 2
    assert summarise({"under_load": {"wall_s": 1.0, "chats": []}, "alone": [],
                      "completion_alone": [], "completion_during_streams": [],
                      "typing_fim": {"refused": None, "rounds": [rows]}})["fim_beyond_new_p50"] \
        in beyond


@pytest.mark.model
def test_side_by_side_on_a_real_server_answers_every_phase_each_round(fim_server, monkeypatch):
    monkeypatch.setattr(serve_concurrent, "EMBEDDING_INPUTS", 8)  # a test's worth
    monkeypatch.setattr(serve_concurrent, "ROUNDS", 2)
    monkeypatch.setattr(serve_concurrent, "SETTLE_S", 0.0)
    runs: dict = {"ours": {"parallel": 1}}

    serve_concurrent.side_by_side({"ours": (fim_server.base_url, FIM_MODEL)}, runs,
                                  serve_concurrent.Workload(1, 1, 4), lambda line: None)

    run = runs["ours"]
    assert [len(rows) for rows in run["chats_only"]["chats"]] == [1, 1]
    assert all(row["error"] is None for rows in run["chats_only"]["chats"] for row in rows)
    typed = run["typing_fim"]["rounds"]
    assert run["typing_fim"]["refused"] is None and [len(rows) for rows in typed] == [8, 8]
    # Each round's typist starts a file of its own: its first request finds no more cached than
    # the lead of the layout (BOS, repo and file name), the next ones all but what changed.
    assert all(rows[0]["prefilled_tokens"] >= 0.75 * rows[0]["prompt_tokens"]
               and rows[1]["prefilled_tokens"] < 0.5 * rows[1]["prompt_tokens"] for rows in typed)
    assert len(run["alone"]) == 2 and all(row["error"] is None for row in run["alone"])
    embedded = run["embeddings_alone"]
    assert embedded["refused"] is None and len(embedded["rounds"]) == 2
    assert all(row["vectors"] == 8 and row["tokens"] > 8 and row["latency_ms"] > 0
               for row in embedded["rounds"])
