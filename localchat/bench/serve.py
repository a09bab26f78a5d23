"""``localchat bench --serve``: what ``localchat serve`` gives an editor or app that re-sends its
whole history each request, side by side with the servers people run instead.

- **Interleaved conversations**: N conversations (default 4) x T turns (default 10), each request
  the whole history through the OpenAI API, streamed, greedy; the conversations take turns
  (turn 1 of each, then turn 2 of each, ...). Per turn: TTFT, the cached share (cached tokens /
  the previous request's prompt + reply tokens), decode tokens/s. The same workload runs, turn by
  turn in the same loop (so a noisy moment hits every server), against llama-cpp-python's server
  on the same model file (started here) and against each ``--against`` URL (llama-server,
  Ollama's /v1).
- **What HTTP adds**: the same fresh prompts answered by an engine in this process (what ``ask``
  does) and through serve, alternating: TTFT difference and decode-speed ratio (medians).
- **Many clients**: 16 streaming requests sent 30 ms apart: every stream complete, its first
  text in the order they were sent, no error (also for llama-cpp-python's server, which cuts
  them).

Targets (issue 41) are checked at the end (``serve_targets``).
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from localchat.bench.script import DEFAULT_QUESTIONS, DEFAULT_SYSTEM
from localchat.bench.serve_clients import (
    Answer,
    chat_body,
    llama_cpp_server,
    llama_cpp_server_available,
    localchat_serve,
    served_name,
    stream_chat,
    wait_ready,
)
from localchat.bench.targets import target
from localchat.engine.runtime import physical_cores
from localchat.settings import Settings

# Between one server's (or the in-process engine's) work and another's: llama.cpp's CPU threads
# spin-wait for new work for a while after a graph (ggml's threadpool "poll"), taking cores from
# whichever process runs next. Measured on 2 cores: whichever side ran second prefilled 1.2-2.6x
# slower without a pause.
SETTLE_S = 1.0

LLAMA_SERVER_NOTE = ("llama.cpp's own llama-server is not installed here; start one on the same "
                     "model and pass --against http://127.0.0.1:PORT to compare")


def measure_serve(model: str | None, config: Settings, *, conversations: int, turns: int,
                  max_tokens: int, n_ctx: int, against: list[str], rounds: int,
                  clients: int, say: Callable[[str], None]) -> dict[str, Any]:
    from localchat.models.registry import require_local, resolve_model

    spec = resolve_model(model or config.default_model)
    path = require_local(spec)
    reference = model or config.default_model
    report: dict[str, Any] = {"model": spec.name, "n_ctx": n_ctx, "conversations": conversations,
                              "turns": turns, "max_tokens": max_tokens, "servers": {},
                              "notes": [LLAMA_SERVER_NOTE] if not against else []}
    with localchat_serve(reference, n_ctx, config.serve.cache_ram_mib) as serve_url:
        say(f"localchat serve is up at {serve_url}")
        servers = {"localchat serve": serve_url}
        missing = llama_cpp_server_available()
        with _optional_llama_cpp(path, n_ctx, missing) as llama_url:
            if llama_url is not None:
                servers["llama-cpp-python"] = llama_url
                say(f"llama-cpp-python's server is up at {llama_url}")
            else:
                report["notes"].append(missing)
            for url in against:
                wait_ready(url.rstrip("/").removesuffix("/v1"))
                servers[url] = url.rstrip("/").removesuffix("/v1")
            names = {name: served_name(url, name, spec.name) for name, url in servers.items()}
            report["servers"] = interleaved(servers, names, conversations, turns, max_tokens, say)
            report["concurrent"] = {name: concurrent(url, names[name], clients)
                                    for name, url in servers.items()}
            say(f"{clients} concurrent streams sent to each server")
    report["http_overhead"] = http_overhead(reference, config, n_ctx, rounds, say)
    report["targets"] = serve_targets(report)
    return report


class _optional_llama_cpp:
    """llama-cpp-python's server when it is installed (the URL), else None."""

    def __init__(self, path: Any, n_ctx: int, missing: str | None) -> None:
        self._context = None if missing else llama_cpp_server(path, n_ctx, physical_cores())

    def __enter__(self) -> str | None:
        return self._context.__enter__() if self._context is not None else None

    def __exit__(self, *exc: Any) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)


def _question(conversation: int, turn: int) -> str:
    question = DEFAULT_QUESTIONS[turn % len(DEFAULT_QUESTIONS)]
    return f"(Conversation {conversation + 1}) {question}"


def interleaved(servers: dict[str, str], names: dict[str, str], conversations: int, turns: int,
                max_tokens: int, say: Callable[[str], None]) -> dict[str, Any]:
    histories = {name: [[{"role": "system", "content": DEFAULT_SYSTEM}] for _ in range(conversations)]
                 for name in servers}
    rows: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in servers}
    previous: dict[tuple[str, int], Answer] = {}
    with httpx.Client(timeout=600) as client:
        for turn in range(turns):
            for name in servers:
                if len(servers) > 1:
                    time.sleep(SETTLE_S)
                row = []
                for c in range(conversations):
                    messages = histories[name][c]
                    messages.append({"role": "user", "content": _question(c, turn)})
                    answer = stream_chat(client, servers[name], chat_body(names[name], messages, max_tokens))
                    messages.append({"role": "assistant", "content": answer.text})
                    row.append(_request_row(answer, previous.get((name, c))))
                    previous[(name, c)] = answer
                rows[name].append(row)
            say(f"turn {turn + 1}/{turns} answered by {len(servers)} server(s)")
    return {name: {"url": servers[name], "turns": [_turn_summary(row) for row in rows[name]],
                   "requests": rows[name], "median_ttft_ms": _median(
                       [r["ttft_ms"] for row in rows[name] for r in row])} for name in servers}


def _request_row(answer: Answer, previous: Answer | None) -> dict[str, Any]:
    share = None
    if previous is not None and answer.cached_tokens is not None and previous.prompt_tokens:
        share = answer.cached_tokens / (previous.prompt_tokens + previous.completion_tokens)
    return {"ttft_ms": _round(answer.ttft_ms), "cached_tokens": answer.cached_tokens,
            "prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "cached_share": _round(share, 4), "decode_tps": _round(answer.decode_tps),
            "error": answer.error}


def _turn_summary(row: list[dict[str, Any]]) -> dict[str, Any]:
    shares = [r["cached_share"] for r in row if r["cached_share"] is not None]
    return {"ttft_ms": _median([r["ttft_ms"] for r in row]),
            "cached_share_min": min(shares) if shares else None,
            "decode_tps": _median([r["decode_tps"] for r in row]),
            "errors": sum(1 for r in row if r["error"])}


def concurrent(url: str, model: str, clients: int) -> dict[str, Any]:
    """``clients`` streams sent 30 ms apart from one thread (so the order they arrive in is
    known), each read on its own thread: complete, first text in the order sent (requests start
    in arrival order; with parallel slots several stream at once, so they need not end in it),
    no error?"""
    time.sleep(SETTLE_S)
    ended: list[tuple[float, bytes]] = [(0.0, b"")] * clients
    target = urlsplit(url)

    def read(i: int, sock: socket.socket) -> None:
        data, first = b"", None
        with sock:
            while chunk := sock.recv(65536):
                data += chunk
                if first is None and _TEXT.search(data):
                    first = time.perf_counter()
        ended[i] = (first if first is not None else time.perf_counter(), data)

    threads = []
    for i in range(clients):
        body = json.dumps({**chat_body(model, [{"role": "user", "content":
                                            f"Client {i}: say hello in one sentence."}], 16),
                           "stream": True}).encode()
        sock = socket.create_connection((target.hostname, target.port or 80), timeout=900)
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {target.netloc}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        threads.append(threading.Thread(target=read, args=(i, sock)))
        threads[-1].start()
        time.sleep(0.03)
    for thread in threads:
        thread.join(900)
    complete = [bool(_FINISHED.search(data)) and b"data: [DONE]" in data for _, data in ended]
    errors = sum(1 for _, data in ended if not data.startswith(b"HTTP/1.1 200") or b'"error"' in data)
    times = [at for at, _ in ended]
    # Streams that start in one batch show their first text in the same step, in any order.
    in_order = all(later >= earlier - SAME_STEP_S for earlier, later in zip(times, times[1:]))
    return {"clients": clients, "complete": sum(complete), "errors": errors,
            "in_order": in_order}


SAME_STEP_S = 0.025  # first texts this close came out of one decode step (~7-20 ms here)
_TEXT = re.compile(rb'"content":\s*"[^"]')
_FINISHED = re.compile(rb'"finish_reason":\s*"(stop|length)"')


def http_overhead(model: str, config: Settings, n_ctx: int, rounds: int,
                  say: Callable[[str], None]) -> dict[str, Any]:
    """The same fresh prompts answered by one engine in this process, alternately read directly
    (as ``ask`` reads a turn) and through serve's HTTP API over that same engine (a ServeApp on
    a thread here): what HTTP, the queue and the state pool add, with the engine, its threads
    and the machine's load the same for both."""
    from localchat.engine.factory import open_engine
    from localchat.models.registry import resolve_model
    from localchat.serve.app import ServeApp, ServeOptions
    from localchat.serve.http import Limits
    from localchat.serve.model_host import ModelHost

    engine = open_engine(model, config, n_ctx=n_ctx)
    engine.load()
    host = ModelHost(config, resolve_model(model), n_ctx=n_ctx,
                     cache_bytes=config.serve.cache_ram_mib * 1024**2,
                     engine_factory=lambda _: engine)
    served = host.default().name
    options = ServeOptions("127.0.0.1", 0, None, [], 4, Limits())
    ttft_gap, ratios = [], []
    try:
        with ServeApp(host, options).in_thread() as app, httpx.Client(timeout=600) as client:
            for i in range(rounds):
                # Two new conversations a round, of the same length, each after the other's:
                # both reuse the system prompt's cells and prefill the rest.
                direct, through_http = (
                    [{"role": "system", "content": DEFAULT_SYSTEM},
                     {"role": "user", "content": f"(Round {i + 1}{side}) {DEFAULT_QUESTIONS[i % 10]}"}]
                    for side in "ab")
                # Which goes first alternates: on a shared machine, a run's neighbour in time
                # matters more than anything measured here.
                if i % 2:
                    served_answer = stream_chat(client, app.base_url, chat_body(served, through_http, 64))
                    ttft, tps = _direct(engine, direct)
                else:
                    ttft, tps = _direct(engine, direct)
                    served_answer = stream_chat(client, app.base_url, chat_body(served, through_http, 64))
                if served_answer.ttft_ms is not None:
                    ttft_gap.append(served_answer.ttft_ms - ttft)
                if tps and served_answer.decode_tps:
                    ratios.append(served_answer.decode_tps / tps)
        say(f"{rounds} prompts answered directly and through serve's API on one engine")
    finally:
        host.unload()
    return {"rounds": rounds, "ttft_minus_in_process_ms": _median(ttft_gap),
            "decode_ratio": _round(statistics.median(ratios), 3) if ratios else None}


def _direct(engine: Any, messages: list[dict]) -> tuple[float, float | None]:
    """(TTFT ms, decode tokens/s) of a turn read from the engine as ``ask`` reads it."""
    from localchat.engine.options import Sampling
    from localchat.errors import UserError
    from localchat.events import Failed, Token

    started = time.perf_counter()
    handle = engine.submit(messages, Sampling(temperature=0, repeat_penalty=1.0, max_tokens=64))
    times = [time.perf_counter() for event in handle if isinstance(event, Token) and event.text]
    if isinstance(handle.result, Failed) or not times:
        raise UserError(f"the engine gave no reply: {handle.result}")
    tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
    return (times[0] - started) * 1000.0, tps


def serve_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    ours = report["servers"]["localchat serve"]
    shares = [r["cached_share"] for row in ours["requests"][1:] for r in row
              if r["cached_share"] is not None]
    if shares:
        checks.append(target("turn >= 2: cached / previous prompt + reply (min)", min(shares),
                             0.95, min(shares) >= 0.95))
    turns = ours["turns"]
    if len(turns) >= 10 and turns[1]["ttft_ms"] and turns[9]["ttft_ms"]:
        ratio = round(turns[9]["ttft_ms"] / turns[1]["ttft_ms"], 2)
        checks.append(target("TTFT turn 10 / turn 2 (median over conversations)", ratio, 1.3,
                             ratio <= 1.3))
    for name, other in report["servers"].items():
        if name == "localchat serve" or not other["median_ttft_ms"] or not ours["median_ttft_ms"]:
            continue
        limit = 0.3 if name == "llama-cpp-python" else 1.1
        ratio = round(ours["median_ttft_ms"] / other["median_ttft_ms"], 3)
        checks.append(target(f"median TTFT / {name}'s", ratio, limit, ratio <= limit))
    overhead = report["http_overhead"]
    if overhead["ttft_minus_in_process_ms"] is not None:
        gap = overhead["ttft_minus_in_process_ms"]
        checks.append(target("TTFT through serve - in process (ms, median)", gap, 10, gap <= 10))
    if overhead["decode_ratio"] is not None:
        ratio = overhead["decode_ratio"]
        checks.append(target("decode tokens/s through serve / in process (median)", ratio, 0.95,
                             ratio >= 0.95))
    many = report["concurrent"]["localchat serve"]
    ok = many["complete"] == many["clients"] and many["in_order"] and many["errors"] == 0
    checks.append(target(f"{many['clients']} concurrent streams: complete, started in order, "
                         "no error",
                         f"{many['complete']}/{many['clients']} complete, "
                         f"{'in order' if many['in_order'] else 'OUT OF ORDER'}, "
                         f"{many['errors']} errors", "all", ok))
    return checks


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 1) if present else None


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def print_serve(report: dict[str, Any]) -> None:
    """The side-by-side table, then the rest and the targets."""
    from localchat.bench.report import lines

    names = list(report["servers"])
    print(f"bench --serve: {report['model']}, n_ctx {report['n_ctx']}, {report['conversations']} "
          f"conversations x {report['turns']} turns interleaved, {report['max_tokens']}-token "
          "greedy replies, whole history each request (TTFT ms median / cached share min / tok/s)")
    print("turn " + "".join(f"| {name[:28]:^28} " for name in names))
    for t in range(report["turns"]):
        cells = []
        for name in names:
            s = report["servers"][name]["turns"][t]
            share = "-" if s["cached_share_min"] is None else f"{s['cached_share_min']:.3f}"
            tps = "-" if s["decode_tps"] is None else f"{s['decode_tps']:.0f}"
            ttft = "-" if s["ttft_ms"] is None else f"{s['ttft_ms']:.0f}"
            errors = f" {s['errors']}err" if s["errors"] else ""
            cells.append(f"| {ttft:>7} {share:>7} {tps:>5}{errors:<6} ")
        print(f"{t + 1:>4} " + "".join(cells))
    print("median TTFT (ms): " + ", ".join(
        f"{name} {report['servers'][name]['median_ttft_ms']}" for name in names))
    for name, many in report["concurrent"].items():
        print(f"{many['clients']} concurrent streams, {name}: {many['complete']} complete, "
              f"{'in order' if many['in_order'] else 'not in order'}, {many['errors']} errors")
    for line in lines({"http_overhead": report["http_overhead"], "notes": report["notes"],
                       "targets": report["targets"]}):
        print(line)
