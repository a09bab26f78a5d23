"""The speed targets each bench mode checks, as ``{"target", "value", "limit", "ok"}`` records
at the end of its report (``[ok]``/``[MISS]`` lines in the text output)."""

from __future__ import annotations

import statistics
from typing import Any


def target(name: str, value: Any, limit: Any, ok: bool) -> dict[str, Any]:
    """One checked target: what is measured, this run's value, the limit, and whether it holds."""
    return {"target": name, "value": value, "limit": limit, "ok": bool(ok)}


def conversation_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation bench's targets on this run's numbers (``measure_conversation``'s
    report); also adds ``ttft_late_early_ratio`` to its summary when there are ten turns."""
    turns = report["turns"]
    checks: list[dict[str, Any]] = []

    def check(name: str, value: Any, limit: Any, ok: bool) -> None:
        checks.append(target(name, value, limit, ok))

    later = turns[1:]
    if later:
        # What stayed in context from the previous turn (all of it, unless turns were trimmed).
        reuse = [t["cache_n"] / max(1, prev["n_ctx_used"] - t["trimmed_n"]) for prev, t in zip(turns, later)]
        check("turn k>=2: cache_n / tokens kept from the previous turn", round(min(reuse), 4), 0.99,
              min(reuse) >= 0.99)
    n_ctx = report["n_ctx"]
    check("n_ctx_used never exceeds n_ctx", max(t["n_ctx_used"] for t in turns), n_ctx,
          all(t["n_ctx_used"] <= n_ctx for t in turns))
    trims = [t for t in turns if t["trimmed_n"]]
    if trims:
        median = statistics.median(t["ttft_ms"] for t in turns)
        worst = max(t["ttft_ms"] for t in trims)
        check("TTFT of a trimming turn / median TTFT", round(worst / median, 2), 2.0, worst <= 2 * median)
        cap = report.get("summary_max_tokens")
        if cap is not None:
            top = max(t["summary_n"] for t in turns)
            check("summary tokens never exceed summary_max_tokens", top, cap, top <= cap)
    gap = report["summary"]["max_ttft_minus_prompt_ms"]
    check("ttft_ms - prompt_ms per turn (ms)", gap, 25, gap <= 25)
    median_gap = report["summary"]["median_ttft_minus_prompt_ms"]
    check("median ttft_ms - prompt_ms (ms)", median_gap, 5, median_gap <= 5)
    ratio = report["raw_decode"]["decode_vs_raw_median"]
    if ratio is not None:  # None: no turn could be measured (a memory that cannot drop cells)
        check("decode speed / bare llama.cpp loop at each turn's depth (median)", ratio, 0.95,
              ratio >= 0.95)
    exact = report.get("exactness")
    if exact:
        # Every turn not on shifted cells replies as a fresh prefill does, up to a near-tie that
        # batch-shape rounding flipped (shown with its logit margin in first_differences).
        check("exact_turns / turns (greedy reply == fresh prefill; near-ties counted apart)",
              f"{exact['exact_turns']}/{exact['turns']} (+{exact['near_tie_turns']} near-tie, "
              f"{exact['approx_turns']} shifted, {exact['not_comparable_turns']} after a reply that "
              "does not tokenize back)", "0 wrong", exact["wrong_turns"] == 0)
    if "baseline" in report and len(turns) >= 10:
        ttft = turns[9]["ttft_ms"]
        fresh = report["baseline"]["turns"][9]["ttft_ms"]
        check("TTFT turn 10 / fresh-context TTFT turn 10", round(ttft / fresh, 3), 0.2, ttft <= 0.2 * fresh)
    if len(turns) >= 10:
        report["summary"]["ttft_late_early_ratio"] = round(turns[9]["ttft_ms"] / turns[1]["ttft_ms"], 2)
    abort = report.get("abort") or {}
    decoding = abort.get("decoding")
    if decoding and decoding["latency_ms"] is not None:
        limit = round(decoding["tpot_ms"] + 30, 1)
        check("stop while decoding (ms)", round(decoding["latency_ms"], 1), limit,
              decoding["latency_ms"] <= limit)
    prefill = abort.get("prefill")
    if prefill and prefill["latency_ms"] is not None:
        check("stop during a 3000-token prefill (ms)", round(prefill["latency_ms"], 1), 150,
              prefill["latency_ms"] <= 150)
    return checks


def restore_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A reopened session prefills only the new turn, and answers about as fast as one never
    closed (``bench.restore``'s report)."""
    restored, warm = report["restored"], report["warm"]
    ratio = report["restored_ttft_over_warm"]
    return [
        target("restored prompt_n <= new tokens + a few (warm prompt_n + 4)",
               restored["prompt_n"], warm["prompt_n"] + 4, restored["prompt_n"] <= warm["prompt_n"] + 4),
        target("restored TTFT (restore included) / warm TTFT", ratio, 2.0, ratio <= 2.0),
    ]


def typing_targets(delay_s: float, paste_ttft_ms: float, short_ttft_ms: float) -> list[dict[str, Any]]:
    """A long paste sent ``delay_s`` after pasting answers within twice a short message's TTFT
    (``bench.typing_prefill``)."""
    ratio = round(paste_ttft_ms / short_ttft_ms, 2) if short_ttft_ms else None
    return [target(f"paste TTFT ({delay_s:g} s after the paste) / short TTFT", ratio, 2.0,
                   bool(short_ttft_ms) and paste_ttft_ms / short_ttft_ms <= 2.0)]


def speculative_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Speculative decoding pays on edits, costs nothing on prose, and never changes a reply
    (``bench.speculative``'s report)."""
    summary = report["summary"]
    checks = []
    if "edit" in summary:
        ratio = summary["edit"]["median_ratio"]
        checks.append(target("edit-style tokens/s, speculation on / off (median)", ratio, 1.5,
                             ratio >= 1.5))
    if "prose" in summary:
        ratio = summary["prose"]["median_ratio"]
        checks.append(target("prose tokens/s, speculation on / off (median)", ratio, 0.97,
                             ratio >= 0.97))
    wrong = sum(s["greedy_wrong"] for s in summary.values())
    near = sum(s["greedy_near_tie"] for s in summary.values())
    checks.append(target("greedy replies identical or differing after a near-tie",
                         f"{wrong} wrong ({near} near-tie)", "0 wrong", wrong == 0))
    prompts = sum(s["prompts"] for s in summary.values())
    same = sum(s["seeded_same"] for s in summary.values())
    checks.append(target("same reply at temperature 0.7 with a fixed seed", f"{same}/{prompts}",
                         f"{prompts}/{prompts}", same == prompts))
    exact = report.get("exact_kernels")
    if exact:
        n = exact["prompts"]
        both = exact["greedy_identical"] + exact["seeded_identical"]
        checks.append(target("drafted replies identical to plain ones where checks round as "
                             "single decodes do (greedy and seeded)",
                             f"{both}/{2 * n} ({exact['draft_n']} drafted)", f"{2 * n}/{2 * n}",
                             both == 2 * n and exact["draft_n"] > 0))
    return checks


# The stream the eye sees as steady (issue 23): frames and display lag within 100 ms, frame cost
# flat along the reply, and with a core to spare frames within 50 ms.
FRAME_P90_MS = 100
DISPLAY_LAG_P95_MS = 100
FRAME_CPU_GROWTH = 1.5
SPARE_CORE_FRAME_P90_MS = 50
KEYPRESS_P95_MS = 50
DECODE_RATIO = 0.95


def tui_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """``bench --tui``: decode through the app, keypresses, and the frames of each reply
    (``bench.app``'s report)."""
    checks = []
    if report.get("overhead_percent") is not None:
        ratio = round(report["in_app_tokens_per_s"] / report["engine_alone_tokens_per_s"], 3)
        checks.append(target("decode in the app (headless) / engine alone", ratio, DECODE_RATIO, ratio >= DECODE_RATIO))
    if report.get("keypress_p95_ms") is not None:
        checks.append(target("keypress while streaming, p95 (ms)", report["keypress_p95_ms"], KEYPRESS_P95_MS,
                             report["keypress_p95_ms"] <= KEYPRESS_P95_MS))
    runs = [("test model", report.get("frames"))]
    runs += [(f"scripted {name}", frames) for name, frames in report.get("shapes", {}).items()]
    for name, frames in runs:
        if not frames or not frames.get("frames"):
            continue
        p90, lag = frames["frame_interval_p90_ms"], frames["display_lag_p95_ms"]
        checks.append(target(f"{name}: frame interval p90 (ms)", p90, FRAME_P90_MS, p90 <= FRAME_P90_MS))
        checks.append(target(f"{name}: display lag p95 (ms)", lag, DISPLAY_LAG_P95_MS, lag <= DISPLAY_LAG_P95_MS))
        growth = frames.get("frame_cpu_late_over_early")
        if growth is not None:
            checks.append(target(f"{name}: frame CPU at ~2,000 tokens / at ~100", growth, FRAME_CPU_GROWTH,
                                 growth <= FRAME_CPU_GROWTH))
    one = (report.get("one_thread") or {}).get("frames")
    if one and one.get("frames"):
        p90 = one["frame_interval_p90_ms"]
        checks.append(target("llama.cpp on one thread: frame interval p90 (ms)", p90, SPARE_CORE_FRAME_P90_MS,
                             p90 <= SPARE_CORE_FRAME_P90_MS))
    return checks


def pty_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """``bench --tui --pty``: decode through the app on a terminal, keypresses, frames seen there."""
    checks = [target("decode in the app on a pty / engine alone (ask)", report["decode_ratio"], DECODE_RATIO,
                     report["decode_ratio"] >= DECODE_RATIO)]
    if report.get("keypress_p95_ms") is not None:
        checks.append(target("keypress while streaming on a pty, p95 (ms)", report["keypress_p95_ms"],
                             KEYPRESS_P95_MS, report["keypress_p95_ms"] <= KEYPRESS_P95_MS))
    if report.get("frame_interval_p90_ms") is not None:
        checks.append(target("screen updates on the pty: interval p90 (ms)", report["frame_interval_p90_ms"],
                             FRAME_P90_MS, report["frame_interval_p90_ms"] <= FRAME_P90_MS))
    return checks
