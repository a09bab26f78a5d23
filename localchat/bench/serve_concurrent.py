"""``localchat bench --serve --concurrent C``: many clients on one server at once, as a chat window,
an editor's completions and a search index share it. ``localchat serve --parallel C`` (C slots
decoding in one batch) against ``localchat serve --parallel 1`` (one request at a time) and
against each ``--against`` server (llama-server ``-np C``), on the same model.

Each server runs the whole workload alone, one after another (SETTLE_S before each: another
process's llama.cpp threads may still be spinning), every request greedy with no repeat penalty:

- **Under load**: C chat clients start together, each ``turns`` turns (3) of ``max_tokens``-token
  replies (48), the whole history each request, streamed. Once the first chat streams, a typist's
  burst: TYPING_REQUESTS completions (``/v1/completions``, each the previous prompt plus a few
  characters, TYPING_MAX_TOKENS tokens, streamed, one after another), and one embeddings request
  of EMBEDDING_INPUTS inputs (``/v1/embeddings``). Each kind is timed apart: chat and completion
  TTFT, the embeddings request's latency, and the chats' reply tokens over the phase's wall time
  (all streams together; prefill and waiting for a slot included).
- **One client alone**: one chat client, the same turns: its decode tokens/s.
- **A completion while chats stream**: ``probe_streams(C)`` chats (3 when C >= 4) streaming, then
  one completion of a fresh prompt; its TTFT against the same shape of prompt sent alone
  (PROBE_ROUNDS rounds of each).

A kind a server refuses (a 4xx or 501, e.g. llama-server without ``--embeddings``) is recorded as
not supported, not as a failure. The numbers are summed up and checked in
``serve_concurrent_report``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from localchat.bench.script import DEFAULT_QUESTIONS, DEFAULT_SYSTEM
from localchat.bench.serve import SETTLE_S
from localchat.bench.serve_clients import (
    Answer,
    chat_body,
    localchat_serve,
    served_name,
    stream_chat,
    stream_completion,
    wait_ready,
)
from localchat.bench.serve_concurrent_report import (
    NO_AGAINST_NOTE,
    concurrent_targets,
    local_name,
    refusal_notes,
    summarise,
)
from localchat.settings import Settings

TYPING_REQUESTS = 8
TYPING_MAX_TOKENS = 16
TYPED_CHARS = 5  # characters typed between two requests
KEYSTROKE_GAP_S = 0.05
EMBEDDING_INPUTS = 64
PROBE_ROUNDS = 3
REQUEST_TIMEOUT_S = 600.0

# What the typist writes: each completion request is a longer prefix of it.
TYPED_CODE = '''def moving_average(values, window):
    """The average of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    averages = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        averages.append(total / window)
    return averages
'''
FIRST_TYPED = 200  # characters of TYPED_CODE in the first request, and in each probe's prompt


@dataclass(frozen=True)
class Workload:
    """What every server is sent: C chat clients, their turns, the reply length. ``run`` starts
    every prompt of this run, so that an --against server kept up between runs cannot answer
    from the previous run's cache (every server of one run gets the same prompts)."""

    clients: int
    turns: int
    max_tokens: int
    run: str = field(default_factory=lambda: secrets.token_hex(3))


def probe_streams(clients: int) -> int:
    """How many chats stream while the probe's completion arrives: 3 (the issue's figure) when a
    slot is left for it, else one fewer than the slots."""
    return max(1, min(3, clients - 1))


def measure_concurrent(model: str | None, config: Settings, *, clients: int, turns: int,
                       max_tokens: int, n_ctx: int, against: list[str],
                       say: Callable[[str], None]) -> dict[str, Any]:
    """The whole bench: ``localchat serve --parallel C`` and ``--parallel 1`` (started here), then
    each ``against`` URL; the report with each server's requests, summary and the targets."""
    from localchat.models.registry import require_local, resolve_model

    spec = resolve_model(model or config.default_model)
    require_local(spec)
    reference = model or config.default_model
    work = Workload(clients, turns, max_tokens)
    report: dict[str, Any] = {
        "model": spec.name, "n_ctx": n_ctx, "clients": clients, "turns": turns,
        "max_tokens": max_tokens, "typing_requests": TYPING_REQUESTS,
        "typing_max_tokens": TYPING_MAX_TOKENS, "embedding_inputs": EMBEDDING_INPUTS,
        "probe_streams": probe_streams(clients), "probe_rounds": PROBE_ROUNDS, "run": work.run,
        "servers": {},
        "notes": [] if against else [NO_AGAINST_NOTE]}
    others = {url: url.rstrip("/").removesuffix("/v1") for url in against}
    for base in others.values():  # before minutes of work: a server that is not up fails now
        wait_ready(base)
    for parallel in (clients, 1):
        name = local_name(parallel)
        with localchat_serve(reference, n_ctx, config.serve.cache_ram_mib, parallel) as url:
            say(f"{name} is up at {url}")
            report["servers"][name] = server_run(name, url, spec.name, work, say, parallel)
    for url, base in others.items():
        report["servers"][url] = server_run(url, base, served_name(base, url, spec.name), work,
                                            say)
    report["notes"] += refusal_notes(report)
    report["targets"] = concurrent_targets(report)
    return report


def server_run(name: str, url: str, model: str, work: Workload, say: Callable[[str], None],
               parallel: int | None = None) -> dict[str, Any]:
    """Every phase on one server: its requests as the clients saw them, and their summary."""
    time.sleep(SETTLE_S)
    run: dict[str, Any] = {"url": url, "parallel": parallel,
                           "under_load": under_load(url, model, work)}
    say(f"{name}: {work.clients} chat clients x {work.turns} turns, typing and embeddings at once")
    run["alone"] = _chat_client(url, model, "Alone", work)
    run["completion_alone"] = [_completion_alone(url, model, work, r) for r in range(PROBE_ROUNDS)]
    streams = probe_streams(work.clients)
    run["completion_during_streams"] = [_completion_during_streams(url, model, work, streams, r)
                                        for r in range(PROBE_ROUNDS)]
    say(f"{name}: one client alone; a completion alone and while {streams} chats stream")
    run["summary"] = summarise(run)
    return run


def under_load(url: str, model: str, work: Workload) -> dict[str, Any]:
    """C chat clients at once; once one streams, the typing burst and the embeddings request."""
    streaming = threading.Event()
    chats: list[list[dict[str, Any]]] = [[] for _ in range(work.clients)]
    side: dict[str, Any] = {}

    def chat(i: int) -> None:
        chats[i] = _chat_client(url, model, f"Client {i + 1}", work, streaming.set)

    def typing() -> None:
        streaming.wait(REQUEST_TIMEOUT_S)
        side["completions"] = _typing_burst(url, model, work.run)

    def embeddings() -> None:
        streaming.wait(REQUEST_TIMEOUT_S)
        side["embeddings"] = _embed(url, model)

    chat_threads = [threading.Thread(target=chat, args=(i,), daemon=True)
                    for i in range(work.clients)]
    others = [threading.Thread(target=typing, daemon=True),
              threading.Thread(target=embeddings, daemon=True)]
    started = time.perf_counter()
    for thread in chat_threads + others:
        thread.start()
    for thread in chat_threads:
        thread.join()
    wall_s = time.perf_counter() - started
    streaming.set()  # no chat ever streamed: the others still run, and are timed alone
    for thread in others:
        thread.join()
    return {"wall_s": round(wall_s, 3), "chats": chats, **side}


def _chat_client(url: str, model: str, label: str, work: Workload,
                 on_first_text: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """One client's conversation, turn after turn, each request the whole history."""
    messages = [{"role": "system", "content": f"{DEFAULT_SYSTEM} (Run {work.run}.)"}]
    rows = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for turn in range(work.turns):
            question = DEFAULT_QUESTIONS[turn % len(DEFAULT_QUESTIONS)]
            messages.append({"role": "user", "content": f"({label}) {question}"})
            answer = stream_chat(client, url, chat_body(model, messages, work.max_tokens),
                                 on_first_text)
            rows.append(request_row(answer))
            if answer.error:
                break  # the history would hold an empty reply: what follows measures nothing
            messages.append({"role": "assistant", "content": answer.text})
    return rows


def _typing_burst(url: str, model: str, run: str) -> dict[str, Any]:
    """Completions of a growing prefix, one after another, as an editor asks while one types."""
    rows: list[dict[str, Any]] = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for i in range(TYPING_REQUESTS):
            prompt = f"# typed {run}\n" + TYPED_CODE[:FIRST_TYPED + i * TYPED_CHARS]
            answer = stream_completion(client, url, completion_body(model, prompt))
            if refused(answer):
                return {"refused": answer.error, "requests": rows}
            rows.append(request_row(answer))
            time.sleep(KEYSTROKE_GAP_S)
    return {"refused": None, "requests": rows}


def _completion_alone(url: str, model: str, work: Workload, round_: int) -> dict[str, Any]:
    prompt = fresh_prompt("alone", work.run, round_)
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        answer = stream_completion(client, url, completion_body(model, prompt))
    return {**request_row(answer), "refused": answer.error if refused(answer) else None}


def _completion_during_streams(url: str, model: str, work: Workload, streams: int,
                               round_: int) -> dict[str, Any]:
    """``streams`` fresh chats; once each has its first text, one completion of a fresh prompt.
    ``streams_active``: the chats still streaming when it was sent (a short reply may be over)."""
    first = [threading.Event() for _ in range(streams)]
    ended = [threading.Event() for _ in range(streams)]

    def chat(i: int) -> None:
        question = DEFAULT_QUESTIONS[(round_ + i) % len(DEFAULT_QUESTIONS)]
        label = f"Run {work.run}, stream {round_ + 1}.{i + 1}"
        messages = [{"role": "user", "content": f"({label}) {question}"}]
        try:
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
                stream_chat(client, url, chat_body(model, messages, work.max_tokens), first[i].set)
        finally:
            first[i].set()
            ended[i].set()

    threads = [threading.Thread(target=chat, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for event in first:
        event.wait(REQUEST_TIMEOUT_S)
    active = sum(not event.is_set() for event in ended)
    prompt = fresh_prompt("probe", work.run, round_)
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        answer = stream_completion(client, url, completion_body(model, prompt))
    for thread in threads:
        thread.join()
    return {**request_row(answer), "refused": answer.error if refused(answer) else None,
            "streams_active": active}


def _embed(url: str, model: str) -> dict[str, Any]:
    """One ``/v1/embeddings`` request of EMBEDDING_INPUTS sentences: its latency."""
    inputs = [f"Note {i + 1}: {DEFAULT_QUESTIONS[i % len(DEFAULT_QUESTIONS)]}"
              for i in range(EMBEDDING_INPUTS)]
    started = time.perf_counter()
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            response = client.post(url + "/v1/embeddings", json={"model": model, "input": inputs})
            data = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return {"latency_ms": None, "status": None, "vectors": 0, "refused": None,
                "error": f"{type(exc).__name__}: {exc}"}
    latency_ms = round((time.perf_counter() - started) * 1000.0, 1)
    vectors = len(data) if isinstance(data, list) else 0
    status = response.status_code
    error = None if vectors == EMBEDDING_INPUTS else f"HTTP {status}: {response.text[:200]!r}"
    return {"latency_ms": latency_ms, "status": status, "vectors": vectors,
            "refused": error if _refused_status(status) else None,
            "error": None if _refused_status(status) else error}


def completion_body(model: str, prompt: str) -> dict[str, Any]:
    """A greedy completion, as chat_body's chats are greedy."""
    return {"model": model, "prompt": prompt, "max_tokens": TYPING_MAX_TOKENS, "temperature": 0,
            "repeat_penalty": 1.0}


def fresh_prompt(kind: str, run: str, round_: int) -> str:
    """A prompt no earlier request began with (its first line differs), of the same length for
    every kind of the same length: what a completion alone and one under load both prefill."""
    return f"# {kind} {run} {round_ + 1}\n" + TYPED_CODE[:FIRST_TYPED]


def refused(answer: Answer) -> bool:
    """The server does not answer this kind of request (as opposed to failing one)."""
    return answer.status is not None and _refused_status(answer.status)


def _refused_status(status: int) -> bool:
    return 400 <= status < 500 or status == 501


def request_row(answer: Answer) -> dict[str, Any]:
    return {"ttft_ms": _round(answer.ttft_ms), "completion_tokens": answer.completion_tokens,
            "decode_tps": _round(answer.decode_tps), "status": answer.status,
            "error": answer.error}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
