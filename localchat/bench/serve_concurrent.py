"""``localchat bench --serve --concurrent C``: many clients on one server at once, as a chat window,
an editor's completions and a search index share it. ``localchat serve --parallel C`` (C slots
decoding in one batch) against ``localchat serve --parallel 1`` (one request at a time) and
against each ``--against`` server (llama-server ``-np C``), on the same model.

Each server runs these phases alone, one server after another (SETTLE_S before each: another
process's llama.cpp threads may still be spinning), every request greedy with no repeat penalty:

- **Under load**: C chat clients start together, each ``turns`` turns (3) of ``max_tokens``-token
  replies (48), the whole history each request, streamed. Once the first chat streams, a typist's
  burst: TYPING_REQUESTS completions (``/v1/completions``, each the previous prompt plus a few
  characters, TYPING_MAX_TOKENS tokens, streamed, one after another), and one embeddings request
  of EMBEDDING_INPUTS inputs (``/v1/embeddings``). Each kind is timed apart: chat and completion
  TTFT, the embeddings request's latency, and the chats' reply tokens over the phase's wall time
  (all streams together; prefill and waiting for a slot included).
- **A completion while chats stream**: ``probe_streams(C)`` chats (3 when C >= 4) streaming, then
  one completion of a fresh prompt; its TTFT against the same shape of prompt sent alone
  (PROBE_ROUNDS rounds of each).

The phases whose numbers are compared between servers then run side by side, in ROUNDS rounds in
which every server takes its turn (both localchat servers stay up, idle, until then): the
machine's speed drifts over the minutes a bench runs (the same decode step measured 21.3 ms, then
18.1 a minute later), and taking turns lays that drift on every server alike. One server after
another, minutes apart, a ratio of two servers moved 0.89-1.01 from run to run.

- **Chats only**: C chat clients start together, ``turns`` turns each, nothing else running: chat
  TTFT over every round's requests and the reply tokens over the rounds' wall time (the issue's
  "C concurrent chat clients"; its targets are checked here).
- **Typing with FIM**: a typist's TYPING_REQUESTS llama-server ``/infill`` requests, one after
  another a keystroke gap apart: ``input_prefix`` the typed code, TYPED_CHARS characters longer
  each request, ``input_suffix`` FIM_SUFFIX every time, TYPING_MAX_TOKENS tokens, streamed. Their
  TTFT, and the prompt tokens each evaluated and found cached (``timings``). Only on a model with
  fill-in-the-middle tokens: when ``localchat serve`` refuses ``/infill`` (a model without them),
  the servers after it skip the phase.
- **One client alone**: one chat client, the same turns: its decode tokens/s.
- **Embeddings alone**: one request of EMBEDDING_INPUTS inputs (new texts each round, so that no
  cache answers them) with nothing else running: inputs/s and, where ``usage`` counts them,
  tokens/s.

Every round's prompts are its own (no round finds another's conversation in a cache).

A kind a server refuses (a 4xx or 501, e.g. llama-server without ``--embeddings``) is recorded as
not supported, not as a failure. The numbers are summed up and checked in
``serve_concurrent_report``.
"""

from __future__ import annotations

import contextlib
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
    stream_infill,
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
ROUNDS = 3  # of the phases run side by side (embeddings alone: the summary leaves the first
# round out, a warm-up)
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
# What follows the cursor while one types with FIM. Each /infill prompt is llama-server's layout:
# BOS, fim_rep "myproject", fim_sep "filename", fim_pre, the prefix, fim_suf, this suffix,
# fim_mid. A request's prompt matches the previous one's up to the end of the old prefix (less its
# last token where the new characters change how it tokenizes), so each request after the first
# should prefill the new characters' tokens (+1) and then the tail after the prefix again:
# fim_suf, this suffix's tokens and fim_mid (on SmolLM2's vocabulary: 26 + 2 tokens).
FIM_SUFFIX = "\n\nprint(moving_average([1, 2, 3, 4, 5], 2))\n"


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
        "rounds": ROUNDS,
        "probe_streams": probe_streams(clients), "probe_rounds": PROBE_ROUNDS, "run": work.run,
        "servers": {},
        "notes": [] if against else [NO_AGAINST_NOTE]}
    others = {url: url.rstrip("/").removesuffix("/v1") for url in against}
    for base in others.values():  # before minutes of work: a server that is not up fails now
        wait_ready(base)
    served: dict[str, tuple[str, str]] = {}  # name -> (URL, model name)
    with contextlib.ExitStack() as ours:
        for parallel in (clients, 1):
            name = local_name(parallel)
            url = ours.enter_context(localchat_serve(reference, n_ctx, config.serve.cache_ram_mib,
                                                     parallel))
            say(f"{name} is up at {url}")
            report["servers"][name] = server_run(name, url, spec.name, work, say, parallel)
            served[name] = (url, spec.name)
        for url, base in others.items():
            served[url] = (base, served_name(base, url, spec.name))
            report["servers"][url] = server_run(url, base, served[url][1], work, say)
        side_by_side(served, report["servers"], work, say)
    for run in report["servers"].values():
        run["summary"] = summarise(run)
    report["notes"] += refusal_notes(report)
    report["targets"] = concurrent_targets(report)
    return report


def server_run(name: str, url: str, model: str, work: Workload, say: Callable[[str], None],
               parallel: int | None = None) -> dict[str, Any]:
    """The phases one server runs by itself: its requests as the clients saw them."""
    time.sleep(SETTLE_S)
    run: dict[str, Any] = {"url": url, "parallel": parallel,
                           "under_load": under_load(url, model, work)}
    say(f"{name}: {work.clients} chat clients x {work.turns} turns, typing and embeddings at once")
    run["completion_alone"] = [_completion_alone(url, model, work, r) for r in range(PROBE_ROUNDS)]
    streams = probe_streams(work.clients)
    run["completion_during_streams"] = [_completion_during_streams(url, model, work, streams, r)
                                        for r in range(PROBE_ROUNDS)]
    say(f"{name}: a completion alone and while {streams} chats stream")
    return run


def side_by_side(served: dict[str, tuple[str, str]], runs: dict[str, dict[str, Any]],
                 work: Workload, say: Callable[[str], None]) -> None:
    """ROUNDS rounds; in each, every server of ``served`` (name -> URL, model name) in turn runs
    the chats only, the typist's ``/infill`` requests, one client alone and one embeddings request
    alone. Each server's requests go into its ``runs[name]``: ``chats_only`` (every round's
    chats, the rounds' wall time summed), ``typing_fim`` and ``embeddings_alone`` (by round),
    ``alone`` (every round's replies)."""
    no_fim: str | None = None  # why the model cannot fill in the middle, once ours refused it
    for run in runs.values():
        run.update(chats_only={"wall_s": 0.0, "chats": []}, alone=[],
                   typing_fim={"refused": None, "rounds": []},
                   embeddings_alone={"refused": None, "rounds": []})
    for round_ in range(ROUNDS):
        tag = f"{work.run} {round_ + 1}"
        for name, (url, model) in served.items():
            run = runs[name]
            time.sleep(SETTLE_S)  # the last server's llama.cpp threads may still be spinning
            chats = under_load(url, model, work, beside=False, who=f"Chat-only client {tag}")
            run["chats_only"]["wall_s"] += chats["wall_s"]
            run["chats_only"]["chats"] += chats["chats"]
            typing = run["typing_fim"]
            if no_fim is not None and typing["refused"] is None:
                typing["skipped"] = no_fim
            elif typing["refused"] is None:
                typed = _typing_fim(url, model, tag)
                typing["refused"] = typed["refused"]
                typing["rounds"].append(typed["requests"])
                if typed["refused"] is not None and run.get("parallel") is not None:
                    no_fim = typed["refused"]  # localchat's own refusal: the model has no FIM
            run["alone"] += _chat_client(url, model, f"Alone {round_ + 1}", work)
            embedded = run["embeddings_alone"]
            if not embedded["refused"] and not any(r["error"] for r in embedded["rounds"]):
                embedded["rounds"].append(_embed(url, model, embedding_inputs(
                    f" (alone, run {work.run}, round {round_ + 1})")))
                embedded["refused"] = embedded["rounds"][-1]["refused"]
        say(f"side by side, every server in turn: chats only, typing with /infill, one client "
            f"alone, {EMBEDDING_INPUTS} inputs embedded alone: round {round_ + 1} of {ROUNDS}")


def under_load(url: str, model: str, work: Workload, beside: bool = True,
               who: str = "Client") -> dict[str, Any]:
    """C chat clients at once; once one streams, the typing burst and the embeddings request
    (``beside``; else the chats alone: the issue's own measure of C concurrent chat clients).
    ``who`` begins each client's label (no phase may find another's prompts in a cache)."""
    streaming = threading.Event()
    chats: list[list[dict[str, Any]]] = [[] for _ in range(work.clients)]
    side: dict[str, Any] = {}

    def chat(i: int) -> None:
        chats[i] = _chat_client(url, model, f"{who} {i + 1}", work, streaming.set)

    def typing() -> None:
        streaming.wait(REQUEST_TIMEOUT_S)
        side["completions"] = _typing_burst(url, model, work.run)

    def embeddings() -> None:
        streaming.wait(REQUEST_TIMEOUT_S)
        side["embeddings"] = _embed(url, model, embedding_inputs())

    chat_threads = [threading.Thread(target=chat, args=(i,), daemon=True)
                    for i in range(work.clients)]
    others = [threading.Thread(target=typing, daemon=True),
              threading.Thread(target=embeddings, daemon=True)] if beside else []
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
    # The run first: a server kept up since the last run must not find the system prompt's
    # start in its cache (llama-server found 13 tokens of it, and its first TTFT was 32 ms less).
    messages = [{"role": "system", "content": f"(Run {work.run}.) {DEFAULT_SYSTEM}"}]
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
    return _typist(f"# typed {run}\n", lambda client, prefix: stream_completion(
        client, url, completion_body(model, prefix)))


def _typing_fim(url: str, model: str, run: str) -> dict[str, Any]:
    """``/infill`` requests of a growing prefix before a fixed suffix, as an editor's FIM
    completion (llama.vim, llama.vscode) asks while one types."""
    return _typist(f"# infill {run}\n", lambda client, prefix: stream_infill(
        client, url, infill_body(model, prefix)))


def _typist(first_line: str, send: Callable[[httpx.Client, str], Answer]) -> dict[str, Any]:
    """TYPING_REQUESTS requests, each ``first_line`` and TYPED_CHARS more of TYPED_CODE than the
    last, a keystroke gap apart; stops at a refusal."""
    rows: list[dict[str, Any]] = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for i in range(TYPING_REQUESTS):
            answer = send(client, first_line + TYPED_CODE[:FIRST_TYPED + i * TYPED_CHARS])
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


def embedding_inputs(tag: str = "") -> list[str]:
    """EMBEDDING_INPUTS sentences, ``tag`` in each (texts no earlier request sent)."""
    return [f"Note {i + 1}{tag}: {DEFAULT_QUESTIONS[i % len(DEFAULT_QUESTIONS)]}"
            for i in range(EMBEDDING_INPUTS)]


def _embed(url: str, model: str, inputs: list[str]) -> dict[str, Any]:
    """One ``/v1/embeddings`` request: its latency, and the tokens ``usage`` counts."""
    started = time.perf_counter()
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            response = client.post(url + "/v1/embeddings", json={"model": model, "input": inputs})
            body = response.json() if response.status_code == 200 else {}
            data, usage = body.get("data"), body.get("usage") or {}
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return {"latency_ms": None, "status": None, "vectors": 0, "tokens": None,
                "refused": None, "error": f"{type(exc).__name__}: {exc}"}
    latency_ms = round((time.perf_counter() - started) * 1000.0, 1)
    vectors = len(data) if isinstance(data, list) else 0
    status = response.status_code
    error = None if vectors == len(inputs) else f"HTTP {status}: {response.text[:200]!r}"
    return {"latency_ms": latency_ms, "status": status, "vectors": vectors,
            "tokens": usage.get("prompt_tokens"),
            "refused": error if _refused_status(status) else None,
            "error": None if _refused_status(status) else error}


def completion_body(model: str, prompt: str) -> dict[str, Any]:
    """A greedy completion, as chat_body's chats are greedy."""
    return {"model": model, "prompt": prompt, "max_tokens": TYPING_MAX_TOKENS, "temperature": 0,
            "repeat_penalty": 1.0}


def infill_body(model: str, prefix: str) -> dict[str, Any]:
    """A greedy ``/infill`` request that both llama-server and ``localchat serve`` read the same
    way (``n_predict``: /infill's name for the reply's budget)."""
    return {"model": model, "input_prefix": prefix, "input_suffix": FIM_SUFFIX,
            "n_predict": TYPING_MAX_TOKENS, "temperature": 0, "repeat_penalty": 1.0}


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
            "decode_tps": _round(answer.decode_tps), "prompt_tokens": answer.prompt_tokens,
            "cached_tokens": answer.cached_tokens, "prefilled_tokens": answer.prefilled_tokens,
            "status": answer.status, "error": answer.error}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
