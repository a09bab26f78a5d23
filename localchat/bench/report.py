"""How a bench report is shown: one JSON object (``--json``), the conversation bench as a table
of turns, any other report as indented ``key: value`` lines; and progress notes on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def show(report: dict[str, Any], as_json: bool,
         text: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Print ``report`` as one JSON object, or as text (``text``, default: ``lines``)."""
    if as_json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif text is not None:
        text(report)
    else:
        for line in lines(report):
            print(line)


def progress(enabled: bool) -> Callable[[str], None]:
    """What a long run says after each step: a line on stderr (stdout keeps the report alone)."""

    def say(text: str) -> None:
        if enabled:
            print(f"… {text}", file=sys.stderr, flush=True)

    return say


# Timing fields worth a line of their own in a text report (--json has them all).
_KEY_TIMINGS = ("ttft_ms", "prompt_n", "cache_n", "prompt_ms", "restore_ms", "tpot_ms")


def lines(report: dict[str, Any], indent: str = "") -> list[str]:
    """Any report as ``key: value`` lines, nested dicts indented; a record of timings on one line."""
    out: list[str] = []
    for key, value in report.items():
        if key == "targets":
            out += [_target_line(check) for check in value]
        elif isinstance(value, dict) and "ttft_ms" in value:
            out.append(f"{indent}{key}: " + ", ".join(f"{k} {value[k]}" for k in _KEY_TIMINGS))
        elif isinstance(value, dict):
            out.append(f"{indent}{key}:")
            out += lines(value, indent + "  ")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out.append(f"{indent}{key}: {len(value)} entries (see --json)")
        else:
            out.append(f"{indent}{key}: {value}")
    return out


def print_conversation(report: dict[str, Any]) -> None:
    """The conversation bench as a table of turns, then one line per measurement and target."""
    print(f"model {report['model']} · {report['backend']} · n_ctx {report['n_ctx']}")
    header = f"{'turn':>4} {'cache_n':>7} {'prompt_n':>8} {'prompt_ms':>9} {'TTFT':>7} {'TPOT':>6} " \
             f"{'bare':>6} {'vs_bare':>7} {'itl_p95':>7} {'tokens':>6} {'ctx':>5} {'trim':>5}"
    baseline = report.get("baseline", {}).get("turns")
    raw = report["raw_decode"]
    bare = {row["turn"]: row for row in raw["turns"]}
    print(header + ("  fresh-context TTFT" if baseline else ""))
    for i, t in enumerate(report["turns"]):
        row = bare.get(i + 1)
        versus = f"{row['raw_ms_per_token']:>6.1f} {row['decode_vs_raw']:>7.3f}" if row else f"{'-':>6} {'-':>7}"
        line = (f"{i + 1:>4} {t['cache_n']:>7} {t['prompt_n']:>8} {t['prompt_ms']:>9.0f} "
                f"{t['ttft_ms']:>7.0f} {t['tpot_ms']:>6.1f} {versus} {t['itl_p95_ms']:>7.1f} "
                f"{t['predicted_n']:>6} {t['n_ctx_used']:>5} {t['trimmed_n']:>5}")
        if baseline and i < len(baseline):
            line += f"  {baseline[i]['ttft_ms']:>8.0f}"
        print(line)
    s = report["summary"]
    print(f"summary: TTFT p50 {s['ttft_p50_ms']} ms, p95 {s['ttft_p95_ms']} ms · ITL p50 "
          f"{s['itl_p50_ms']} ms, p95 {s['itl_p95_ms']} ms · {s['tokens_per_second']} tok/s · "
          f"reuse {s['reuse_pct']}%" + (f" · TTFT turn10/turn2 {s['ttft_late_early_ratio']}"
                                        if "ttft_late_early_ratio" in s else ""))
    exact = report.get("exactness")
    if exact:
        ties = ", ".join(f"turn {d['turn']} token {d['token']}: {d['margin']}"
                         for d in exact["first_differences"])
        print(f"exactness: {exact['exact_turns']}/{exact['turns']} greedy replies equal a fresh "
              f"prefill's, {exact['near_tie_turns']} differ after a near-tie, {exact['wrong_turns']} "
              f"wrong, {exact['approx_turns']} on shifted cells, {exact['not_comparable_turns']} not "
              "comparable (an earlier reply's text tokenizes differently)"
              + (f" (margins {ties})" if ties else ""))
    change = report.get("system_change")
    if change:
        print(f"system prompt changed: background prefill {change.get('background_prompt_n')} tokens in "
              f"{change.get('background_ms')} ms · next TTFT {change['next_ttft_ms_after_waiting']} ms "
              f"after it, {change['next_ttft_ms_sent_at_once']} ms when sent at once")
    installs = report.get("summary_installs")
    if installs:
        print(f"summaries put in: {installs['count']} · background prefill up to "
              f"{installs['prompt_n_max']} tokens, {installs['background_ms_max']} ms")
    print(f"decode against llama.cpp's bare loop at each turn's depth (the 'bare' ms column; "
          f"repeat penalty {raw['sampling']['repeat_penalty']}): median {raw['decode_vs_raw_median']}, "
          f"min {raw['decode_vs_raw_min']}")
    for check in report["targets"]:
        print(_target_line(check))


def _target_line(check: dict[str, Any]) -> str:
    # ok None: a target this run could not measure (what it compares with was not there).
    mark = "--" if check["ok"] is None else "ok" if check["ok"] else "MISS"
    return f"  [{mark}] {check['target']}: {check['value']} (limit {check['limit']})"


_FRAME_COLUMNS = (("frames", "frames", ""), ("frame_interval_p50_ms", "p50", "ms"),
                  ("frame_interval_p90_ms", "p90", "ms"), ("frame_interval_max_ms", "max", "ms"),
                  ("display_lag_p95_ms", "lag p95", "ms"), ("frame_cpu_early_ms", "cpu@100", "ms"),
                  ("frame_cpu_late_ms", "cpu@2000", "ms"), ("frame_cpu_late_over_early", "late/early", ""),
                  ("ui_core_percent", "UI %core", "%"), ("ui_cpu_per_token_ms", "cpu/token", "ms"))


def print_tui(report: dict[str, Any]) -> None:
    """``bench --tui``: decode and keypresses, then one row of frame figures per reply."""
    print(f"decode: engine alone {report['engine_alone_tokens_per_s']} tok/s, in the app "
          f"{report['in_app_tokens_per_s']} tok/s (overhead {report['overhead_percent']}%) · "
          f"keypress p50/p95/max {report['keypress_p50_ms']}/{report['keypress_p95_ms']}/"
          f"{report['keypress_max_ms']} ms ({report['keypresses']})")
    one = report.get("one_thread")
    if one:
        print(f"llama.cpp on one thread: engine alone {one['engine_alone_tokens_per_s']} tok/s, in the "
              f"app {one['in_app_tokens_per_s']} tok/s (overhead {one['overhead_percent']}%)")
    rows = [("test model", report.get("frames"))]
    if one:
        rows.append(("test model, 1 thread", one.get("frames")))
    rows += [(f"scripted {name}", frames) for name, frames in report.get("shapes", {}).items()]
    heading = "frames of the reply"
    width = max(len(name) for name in (heading, *(name for name, _ in rows))) + 2
    print(f"{heading:<{width}}" + "".join(f"{title:>11}" for _, title, _ in _FRAME_COLUMNS))
    for name, frames in rows:
        if frames:
            print(f"{name:<{width}}" + "".join(f"{_cell(frames.get(key)):>11}" for key, _, _ in _FRAME_COLUMNS))
    print("  (intervals, display lag and UI CPU per frame in ms; cpu@N: median frame ~N tokens in; UI %core:"
          " the UI thread's share of one core while it streamed; cpu/token: its CPU per token shown)")
    for check in report["targets"]:
        print(_target_line(check))


def print_pty(report: dict[str, Any]) -> None:
    """``bench --tui --pty``: the app on a terminal, against ``ask``."""
    print(f"on a {report['size']} {report['terminal']}: engine alone (ask) {report['engine_alone_tokens_per_s']} "
          f"tok/s, TPOT {report['engine_alone_tpot_ms']} ms · in the app {report['in_app_tokens_per_s']} tok/s, "
          f"TPOT {report['in_app_tpot_ms']} ms · ratio {report['decode_ratio']}")
    print(f"keypress p50/p95/max {report['keypress_p50_ms']}/{report['keypress_p95_ms']}/"
          f"{report['keypress_max_ms']} ms ({report['keypresses']}) · screen updates "
          f"{report['screen_updates']}, interval p50/p90/max {report['frame_interval_p50_ms']}/"
          f"{report['frame_interval_p90_ms']}/{report['frame_interval_max_ms']} ms · "
          f"{report['bytes_written_per_reply']} bytes written per reply")
    for check in report["targets"]:
        print(_target_line(check))


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
