"""What ``bench --serve --concurrent C`` makes of its requests (``serve_concurrent``): each server's
summary, the targets (issue 48) and the side-by-side table. Plain functions of the report, so that
they are tested on made-up numbers.

A target that cannot be measured on this run (no ``--against`` server, or a server that refused a
kind) is recorded with ``"value": "not measured"`` and ``"ok": None``: neither met nor missed.

Typing with FIM is summed up over requests 2..N of every round (the first prefills the whole
prompt, the rest only what changed); embeddings alone over rounds 2..N (the first a warm-up),
over every round when there is only one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from localchat.bench.report import lines
from localchat.bench.targets import target
from localchat.percentiles import percentile

NO_AGAINST_NOTE = ("no --against server: the targets against llama-server are not measured; start "
                   "`llama-server -m MODEL.gguf -np C --embeddings --pooling mean --port 18080` and "
                   "pass --against http://127.0.0.1:18080")
LLAMA_SERVER = "llama-server"  # how a target names an --against server when there is only one


def local_name(parallel: int) -> str:
    """The report's name for ``localchat serve`` started with ``--parallel N``."""
    return f"localchat serve --parallel {parallel}"


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    """One server's figures from its requests (``serve_concurrent.server_run``)."""
    load = run["under_load"]
    chats = [row for rows in load["chats"] for row in rows]
    answered = [row for row in chats if not row["error"]]
    tokens = sum(row["completion_tokens"] for row in answered)
    chat_ttft = _present(row["ttft_ms"] for row in answered)
    typing = load.get("completions") or {"refused": None, "requests": []}
    typed = [row for row in typing["requests"] if not row["error"]]
    typed_ttft = _present(row["ttft_ms"] for row in typed)
    embeddings = load.get("embeddings") or {}
    embedded = not embeddings.get("error") and not embeddings.get("refused")
    return {
        **_chats_only_summary(run.get("chats_only")),
        "chat_requests": len(chats), "chat_errors": len(chats) - len(answered),
        "chat_ttft_p50_ms": _percentile(chat_ttft, 50),
        "chat_ttft_p90_ms": _percentile(chat_ttft, 90),
        "chat_tokens": tokens,
        "aggregate_tps": round(tokens / load["wall_s"], 1) if tokens and load["wall_s"] else None,
        "completion_supported": typing["refused"] is None,
        "completion_requests": len(typing["requests"]),
        "completion_errors": len(typing["requests"]) - len(typed),
        "completion_ttft_p50_ms": _percentile(typed_ttft, 50),
        "completion_ttft_p90_ms": _percentile(typed_ttft, 90),
        "embeddings_supported": not embeddings.get("refused"),
        "embeddings_latency_ms": embeddings.get("latency_ms") if embedded else None,
        "embeddings_error": embeddings.get("error"),
        "single_client_tps": _median(row["decode_tps"] for row in run["alone"] if not row["error"]),
        "completion_alone_ttft_ms": _median(_answered_ttft(run["completion_alone"])),
        "completion_during_streams_ttft_ms": _median(
            _answered_ttft(run["completion_during_streams"])),
        "streams_active_min": min((row["streams_active"] for row in run["completion_during_streams"]),
                                  default=None),
        **_fim_summary(run.get("typing_fim") or {"refused": None, "rounds": []}),
        **_embeddings_alone_summary(run.get("embeddings_alone") or {"refused": None,
                                                                    "rounds": []}),
    }


def _chats_only_summary(phase: dict[str, Any] | None) -> dict[str, Any]:
    """TTFT and reply tokens/s of the C chat clients with nothing else running."""
    rows = [row for rows in (phase or {"chats": []})["chats"] for row in rows]
    answered = [row for row in rows if not row["error"]]
    tokens = sum(row["completion_tokens"] for row in answered)
    ttft = _present(row["ttft_ms"] for row in answered)
    wall = phase and phase["wall_s"]
    return {"chats_only_requests": len(rows), "chats_only_errors": len(rows) - len(answered),
            "chats_only_ttft_p50_ms": _percentile(ttft, 50),
            "chats_only_ttft_p90_ms": _percentile(ttft, 90),
            "chats_only_tps": round(tokens / wall, 1) if tokens and wall else None}


def _fim_summary(typing: dict[str, Any]) -> dict[str, Any]:
    """TTFT and prefill of a typist's ``/infill`` requests (``typing_fim``: its ``rounds``, each
    a list of requests). Requests 2..N of every round are summed up together; the first of each
    prefills its whole prompt. ``fim_beyond_new``: each request's prefilled tokens less the
    tokens its prompt grew by: what it evaluates again besides the new characters (fim_suf, the
    suffix, fim_mid; +1 where the old prefix's last token changed), the same on every request
    when only what changed is prefilled. ``fim_prefilled``: the first round's, request by
    request."""
    rounds = typing.get("rounds") or []
    rows = [row for requests in rounds for row in requests]
    later = [row for requests in rounds for row in requests[1:] if not row["error"]]
    grown = [(row, before) for requests in rounds for before, row in zip(requests, requests[1:])
             if not row["error"] and not before["error"]]
    firsts = [requests[0]["ttft_ms"] for requests in rounds
              if requests and not requests[0]["error"]]
    return {
        "fim_supported": typing["refused"] is None and not typing.get("skipped"),
        "fim_skipped": bool(typing.get("skipped")),
        "fim_requests": len(rows),
        "fim_errors": sum(1 for row in rows if row["error"]),
        "fim_first_ttft_ms": _median(firsts),
        "fim_ttft_p50_ms": _median(row["ttft_ms"] for row in later),
        "fim_prefilled": [row.get("prefilled_tokens") for row in (rounds[0] if rounds else [])],
        "fim_prefilled_p50": _median(row.get("prefilled_tokens") for row in later),
        "fim_beyond_new_p50": _median(_beyond_new(row, before) for row, before in grown),
    }


def _beyond_new(row: dict[str, Any], before: dict[str, Any]) -> int | None:
    prefilled, prompt = row.get("prefilled_tokens"), row.get("prompt_tokens")
    previous = before.get("prompt_tokens")
    if prefilled is None or prompt is None or previous is None:
        return None
    return int(prefilled - (prompt - previous))


def _embeddings_alone_summary(alone: dict[str, Any]) -> dict[str, Any]:
    """Inputs/s and tokens/s of the embeddings requests sent alone (``embeddings_alone``)."""
    rounds = [row for row in alone["rounds"] if not row["error"] and not row["refused"]]
    warm = rounds[1:] or rounds
    return {
        "embeddings_alone_supported": not alone["refused"],
        "embeddings_alone_first_ms": rounds[0]["latency_ms"] if rounds else None,
        "embeddings_alone_ms": _median(row["latency_ms"] for row in warm),
        "embeddings_alone_inputs_per_s": _median(_per_s(row["vectors"], row) for row in warm),
        "embeddings_alone_tokens_per_s": _median(_per_s(row.get("tokens"), row) for row in warm),
        "embeddings_alone_error": next((row["error"] for row in alone["rounds"] if row["error"]),
                                       None),
    }


def _per_s(count: int | None, row: dict[str, Any]) -> float | None:
    return count / row["latency_ms"] * 1000.0 if count and row["latency_ms"] else None


def concurrent_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 48's targets for ``localchat serve --parallel C`` on this run's summaries."""
    clients, servers = report["clients"], report["servers"]
    ours = servers[local_name(clients)]["summary"]
    one_slot = servers[local_name(1)]["summary"]
    others = {name: run["summary"] for name, run in servers.items()
              if not name.startswith("localchat serve")}
    checks = []
    for name, theirs in (others or {LLAMA_SERVER: None}).items():
        shown = LLAMA_SERVER if len(others) <= 1 else name
        for p in (50, 90):
            key = f"chats_only_ttft_p{p}_ms"
            checks.append(_ratio(f"{clients} concurrent chat clients: TTFT p{p} / {shown} "
                                 f"-np {clients}'s", ours[key], theirs and theirs[key], 1.0,
                                 at_most=True))
        checks.append(_ratio(f"{clients} concurrent chat clients: tokens/s, all streams / "
                             f"{shown} -np {clients}'s", ours["chats_only_tps"],
                             theirs and theirs["chats_only_tps"], 1.0))
        checks += _alone_targets(report, ours, theirs, shown)
    checks.append(_ratio(f"{clients} concurrent chat clients: tokens/s, all streams / "
                         "--parallel 1's", ours["chats_only_tps"], one_slot["chats_only_tps"],
                         1.1))
    checks.append(_ratio(f"completion TTFT while {report['probe_streams']} chats stream / alone "
                         "(median)", ours["completion_during_streams_ttft_ms"],
                         ours["completion_alone_ttft_ms"], 2.0, at_most=True))
    checks.append(_ratio("one client alone: decode tokens/s / --parallel 1's",
                         ours["single_client_tps"], one_slot["single_client_tps"], 0.95))
    return checks


def _alone_targets(report: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any] | None,
                   shown: str) -> list[dict[str, Any]]:
    """Typing with FIM and embeddings alone against one --against server (None: there is none),
    or why they are not measured."""
    fim = (f"typing with FIM (/infill): TTFT of requests 2..{report['typing_requests']} / "
           f"{shown}'s (median)")
    why = _unmeasured_fim(ours, theirs, shown)
    fim_check = not_measured(fim, 1.1, why) if why or theirs is None else _ratio(
        fim, ours["fim_ttft_p50_ms"], theirs["fim_ttft_p50_ms"], 1.1, at_most=True)
    embed = f"embeddings alone, {report['embedding_inputs']} inputs: inputs/s / {shown}'s"
    why = _unmeasured_embeddings(ours, theirs, shown)
    embed_check = not_measured(embed, 1.0, why) if why or theirs is None else _ratio(
        embed, ours["embeddings_alone_inputs_per_s"], theirs["embeddings_alone_inputs_per_s"], 1.0)
    return [fim_check, embed_check]


def _unmeasured_fim(ours: dict[str, Any], theirs: dict[str, Any] | None, shown: str) -> str | None:
    if not ours["fim_supported"]:
        return "localchat serve does not answer /infill for this model (no FIM tokens?)"
    if theirs is None:
        return "no --against server"
    return None if theirs["fim_supported"] else f"{shown} does not answer /infill"


def _unmeasured_embeddings(ours: dict[str, Any], theirs: dict[str, Any] | None,
                           shown: str) -> str | None:
    if theirs is None:
        return "no --against server"
    if not theirs["embeddings_alone_supported"]:
        return f"{shown} does not answer /v1/embeddings (start it with --embeddings)"
    return None if ours["embeddings_alone_supported"] else "localchat serve refused embeddings"


def refusal_notes(report: dict[str, Any]) -> list[str]:
    """A line for each kind of request a server does not answer (it had less to do while its
    chats streamed), and for a probe whose chats had ended before its completion was sent."""
    notes = []
    for name, run in report["servers"].items():
        summary, load = run["summary"], run["under_load"]
        if not summary["completion_supported"]:
            notes.append(f"{name} does not answer /v1/completions: "
                         f"{(load.get('completions') or {}).get('refused')}")
        if not summary["embeddings_supported"]:
            notes.append(f"{name} does not answer /v1/embeddings (llama-server needs "
                         f"--embeddings): {(load.get('embeddings') or {}).get('refused')}")
        fim = run.get("typing_fim") or {}
        if fim.get("refused"):
            notes.append(f"{name} does not answer /infill: {fim['refused']}")
        active = summary["streams_active_min"]
        if active is not None and active < report["probe_streams"]:
            notes.append(f"{name}: only {active} of {report['probe_streams']} chats were still "
                         "streaming when a probe's completion was sent")
    return notes


def not_measured(name: str, limit: Any, why: str | None = None) -> dict[str, Any]:
    value = f"not measured ({why})" if why else "not measured"
    return {**target(name, value, limit, False), "ok": None}


def _ratio(name: str, value: float | None, reference: float | None, limit: float, *,
           at_most: bool = False) -> dict[str, Any]:
    """value / reference against ``limit`` (at least, or at most), or not measured."""
    if value is None or not reference:
        return not_measured(name, limit)
    ratio = round(value / reference, 3)
    return target(name, ratio, limit, ratio <= limit if at_most else ratio >= limit)


def _answered_ttft(rows: list[dict[str, Any]]) -> list[float]:
    return _present(row["ttft_ms"] for row in rows if not row["error"] and not row.get("refused"))


def _present(values: Any) -> list[float]:
    return [v for v in values if v is not None]


def _percentile(values: Sequence[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


def _median(values: Any) -> float | None:
    present = _present(values)
    return round(statistics.median(present), 1) if present else None


# -- the table ---------------------------------------------------------------------------------

def _pair(a: float | None, b: float | None) -> str:
    return f"{_number(a)} / {_number(b)}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


_ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("chats only: TTFT p50 / p90 (ms)", lambda s: _pair(s["chats_only_ttft_p50_ms"],
                                                        s["chats_only_ttft_p90_ms"])),
    ("chats only: tok/s, all streams", lambda s: _number(s["chats_only_tps"])),
    ("chats only: requests (errors)", lambda s: f"{s['chats_only_requests']} "
                                                f"({s['chats_only_errors']})"),
    ("under load: chat TTFT p50 / p90", lambda s: _pair(s["chat_ttft_p50_ms"],
                                                        s["chat_ttft_p90_ms"])),
    ("under load: chat tok/s, all", lambda s: _number(s["aggregate_tps"])),
    ("under load: chat requests (errors)", lambda s: f"{s['chat_requests']} ({s['chat_errors']})"),
    ("completion TTFT p50 / p90 (ms)", lambda s: _pair(s["completion_ttft_p50_ms"],
                                                       s["completion_ttft_p90_ms"])
     if s["completion_supported"] else "not supported"),
    ("embeddings request (ms)", lambda s: _number(s["embeddings_latency_ms"])
     if s["embeddings_supported"] else "not supported"),
    ("one client alone: tok/s", lambda s: _number(s["single_client_tps"])),
    ("completion alone: TTFT (ms)", lambda s: _number(s["completion_alone_ttft_ms"])),
    ("completion, chats streaming: TTFT", lambda s: _number(s["completion_during_streams_ttft_ms"])),
    ("/infill typing: TTFT 1st / 2..N p50", lambda s: _fim_cell(
        s, _pair(s["fim_first_ttft_ms"], s["fim_ttft_p50_ms"]))),
    ("/infill 2..N: prefilled (beyond new)", lambda s: _fim_cell(
        s, f"{_number(s['fim_prefilled_p50'])} ({_number(s['fim_beyond_new_p50'])})")),
    ("embeddings alone: inputs/s (tok/s)", lambda s: _embeddings_alone_cell(
        s, f"{_number(s['embeddings_alone_inputs_per_s'])} "
           f"({_number(s['embeddings_alone_tokens_per_s'])})")),
    ("embeddings alone: 1st / later (ms)", lambda s: _embeddings_alone_cell(
        s, _pair(s["embeddings_alone_first_ms"], s["embeddings_alone_ms"]))),
]


def _fim_cell(summary: dict[str, Any], measured: str) -> str:
    if summary["fim_skipped"]:
        return "skipped: no FIM"
    return measured if summary["fim_supported"] else "not supported"


def _embeddings_alone_cell(summary: dict[str, Any], measured: str) -> str:
    return measured if summary["embeddings_alone_supported"] else "not supported"


def print_concurrent(report: dict[str, Any]) -> None:
    """The side-by-side table (one column per server), then the notes and the targets."""
    names = list(report["servers"])
    rounds = report.get("rounds", 1)
    print(f"bench --serve --concurrent {report['clients']}: {report['model']}, n_ctx "
          f"{report['n_ctx']}; each server by itself: {report['clients']} chat clients at once x "
          f"{report['turns']} turns ({report['max_tokens']}-token greedy replies, whole history "
          f"each request) while ('under load') {report['typing_requests']} typed completions "
          f"({report['typing_max_tokens']} tokens) and one embeddings request of "
          f"{report['embedding_inputs']} inputs; a completion alone and while "
          f"{report['probe_streams']} chats stream (median of {report['probe_rounds']}). Then "
          f"side by side, every server in turn in each of {rounds} rounds: the chat clients "
          f"alone ('chats only': every round's requests), {report['typing_requests']} typed "
          f"/infill requests (2..N of every round), one client alone (every reply), one "
          f"embeddings request of {report['embedding_inputs']} inputs ('later': rounds "
          f"2..{rounds})")
    label = max(len(row) for row, _ in _ROWS)
    width = max(18, *(min(len(name), 32) for name in names))
    print(" " * label + "".join(f" | {name[:32]:^{width}}" for name in names))
    for row, cell in _ROWS:
        print(f"{row:<{label}}" + "".join(
            f" | {cell(report['servers'][name]['summary']):^{width}}" for name in names))
    for name in names:
        prefilled = report["servers"][name]["summary"].get("fim_prefilled")
        if any(count is not None for count in prefilled or ()):
            print(f"/infill prompt tokens prefilled, request by request, {name}: "
                  + ", ".join(_number(count) for count in prefilled))
    for note in report["notes"]:
        print(f"note: {note}")
    for line in lines({"targets": report["targets"]}):
        print(line)
