"""``localchat bench``: measured TTFT, TPOT, reuse and stop latency, with targets checked."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from localchat.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="replay a conversation and report TTFT, TPOT, cache reuse and stop latency",
        description="Replays a multi-turn conversation with greedy decoding on one loaded model "
        "and prints per-turn timings, a summary, and how the numbers compare with a fresh context "
        "per turn (--baseline) and with llama.cpp's raw decode loop.",
    )
    p.add_argument("--model", "-m", help="registry name, hf:ORG/REPO/FILE.gguf or a .gguf path")
    p.add_argument("--script", type=Path, help='JSONL file of {"role": "system"|"user", "content": ...}')
    p.add_argument("--turns", type=int, help="number of user turns (cycles the built-in script)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context size (default 4096)")
    p.add_argument("--max-tokens", type=int,
                   help="reply length per turn (default 48; with --router, 128)")
    p.add_argument("--gpu-layers", help="auto, all or a number of layers (default: config)")
    p.add_argument("--baseline", action="store_true",
                   help="also replay each turn on a fresh context (a stateless server)")
    p.add_argument("--no-abort", action="store_true", help="skip the stop-latency measurements")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--restore", action="store_true",
                      help="measure reopening a ~2,000-token session in a new process (KV snapshot) "
                      "against the same turn in a process that never closed it")
    mode.add_argument("--tui", nargs="?", const=1000, type=int, metavar="N_TOKENS",
                      help="measure what streaming N tokens through the running app costs against "
                      "the engine alone, and keypress latency during streaming")
    mode.add_argument("--typing", nargs="?", const=1.0, type=float, metavar="DELAY_S",
                      help="measure prefill while typing: TTFT of a ~1,000-token paste sent DELAY_S "
                      "(default 1) after pasting, against a 20-token message and against no prefill")
    mode.add_argument("--router", nargs="?", const="", metavar="PROMPTS.jsonl",
                      help="score escalation on a labelled prompt set (default: the shipped one): "
                      "the rules, then the whole route through the local model")
    p.add_argument("--rules-only", action="store_true",
                   help="with --router: score the rules alone, without running the local model")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="with --router: the local model's temperature (default 0, greedy)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UserError("--max-tokens must be at least 1")
    if args.router is not None:
        return _print(args, _router_report(args))
    if args.rules_only:
        raise UserError("--rules-only goes with --router")
    args.max_tokens = args.max_tokens or 48
    if args.restore or args.tui or args.typing is not None:
        return _print(args, _model_report(args))
    return _conversation(args)


def _print(args: argparse.Namespace, report: dict) -> int:
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for line in _lines(report):
            print(line)
    return 0


# Timing fields worth a line of their own in a text report (--json has them all).
_KEY_TIMINGS = ("ttft_ms", "prompt_n", "cache_n", "prompt_ms", "restore_ms", "tpot_ms")


def _lines(report: dict, indent: str = "") -> list[str]:
    lines = []
    for key, value in report.items():
        if key == "targets":
            lines += [f"  [{'ok' if c['ok'] else 'MISS'}] {c['target']}: {c['value']} (limit {c['limit']})"
                      for c in value]
        elif isinstance(value, dict) and "ttft_ms" in value:
            lines.append(f"{indent}{key}: " + ", ".join(f"{k} {value[k]}" for k in _KEY_TIMINGS))
        elif isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines += _lines(value, indent + "  ")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{indent}{key}: {len(value)} entries (see --json)")
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def _router_report(args: argparse.Namespace) -> dict:
    """The rules' scores on the set; unless --rules-only, also the whole route (rules, then the
    confidence monitor over the local model's reply) with the configured model."""
    from localchat.remote.router import LABELLED_PROMPTS, evaluate
    from localchat.settings import load_config

    if not (args.temperature >= 0.0 and args.temperature < float("inf")):
        raise UserError("--temperature must be a finite number >= 0")
    path = Path(args.router) if args.router else LABELLED_PROMPTS
    config = load_config()
    settings = config.remote
    if args.rules_only:
        params = _parameter_count(args.model, config)
        return {"set": str(path), "n_params": params, "rules": evaluate(path, settings.router, params)}
    from localchat.engine.factory import open_engine
    from localchat.engine.options import Sampling
    from localchat.models.gguf import parameter_count
    from localchat.remote.route_bench import simulate

    engine = open_engine(args.model, config, n_ctx=args.n_ctx, gpu_layers=_gpu_layers(args),
                         track_confidence=True)
    try:
        params = parameter_count(engine.model_path)
        rules = evaluate(path, settings.router, params)  # before the load: a bad file fails fast
        info = engine.load()
        sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens or 128,
                            seed=1 if args.temperature > 0 else None)
        pipeline = simulate(path, engine, settings, sampling, params)
    finally:
        engine.close()
    return {"set": str(path), "model": info.model, "n_params": params,
            "temperature": args.temperature, "max_tokens": sampling.max_tokens,
            "rules": rules, "route": pipeline}


def _parameter_count(model: str | None, config) -> int | None:
    """The size of ``model`` (or of the default model, if it is on disk) from its GGUF header,
    without loading it; None for a default model not downloaded (the rules then use their
    size-free threshold). A named model that is missing is the usual one-line error."""
    from localchat.errors import ModelNotFound
    from localchat.models.gguf import parameter_count
    from localchat.models.registry import require_local, resolve_model

    try:
        return parameter_count(require_local(resolve_model(model or config.default_model)))
    except ModelNotFound:
        if model:
            raise
        return None


def _model_report(args: argparse.Namespace) -> dict:
    from localchat.models.registry import require_local, resolve_model
    from localchat.settings import Settings, load_config

    config = load_config()
    path = require_local(resolve_model(args.model or config.default_model))
    if args.restore:
        from localchat.bench_restore import measure_restore

        # Default settings on both sides, so the new process computes the same fingerprint.
        report = measure_restore(path, Settings(), n_ctx=args.n_ctx, max_tokens=args.max_tokens)
        report["targets"] = [
            {"target": "restored prompt_n <= new tokens + a few (warm prompt_n + 4)",
             "value": report["restored"]["prompt_n"], "limit": report["warm"]["prompt_n"] + 4,
             "ok": report["restored"]["prompt_n"] <= report["warm"]["prompt_n"] + 4},
            {"target": "restored TTFT (restore included) / warm TTFT", "limit": 2.0,
             "value": report["restored_ttft_over_warm"], "ok": report["restored_ttft_over_warm"] <= 2.0},
        ]
        return report
    if args.typing is not None:
        from localchat.tui.bench_typing import measure_typing_prefill

        return measure_typing_prefill(path, args.typing, n_ctx=args.n_ctx)
    from localchat.tui.bench import measure_streaming_overhead

    return measure_streaming_overhead(path, args.tui)


def _conversation(args: argparse.Namespace) -> int:
    from localchat import bench
    from localchat.engine.factory import open_engine
    from localchat.engine.options import Sampling
    from localchat.settings import load_config

    system, users = bench.load_script(args.script, args.turns)
    config = load_config()
    engine = open_engine(args.model, config, n_ctx=args.n_ctx, gpu_layers=_gpu_layers(args))
    try:
        info = engine.load()
        # Greedy and without a repeat penalty, so the engine and the raw loop pick the same tokens.
        sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=args.max_tokens)
        progress = _Progress(enabled=not args.json)
        replayed, session = bench.replay(engine, system, users, sampling, config)
        turns = [r.timings for r in replayed]
        progress.say(f"replayed {len(turns)} turns")
        report: dict = {"model": info.model, "n_ctx": info.n_ctx, "backend": info.backend,
                        "gpu_layers": info.gpu_layers, "memory": info.memory,
                        "summary_max_tokens": session.keeper.settings.summary_max_tokens,
                        "turns": [t.to_dict() for t in turns], "summary": bench.summarize(turns)}
        if args.baseline:
            fresh = bench.replay_fresh(engine, replayed, sampling)
            report["baseline"] = {"turns": [r.timings.to_dict() for r in fresh],
                                  "summary": bench.summarize([r.timings for r in fresh])}
            report["exactness"] = bench.exactness(engine, replayed, fresh)
            progress.say("replayed the baseline")
        installs = session.keeper.install_timings
        if installs:  # summaries put in after the system prompt, prefilled in the background
            report["summary_installs"] = {
                "count": len(installs),
                "prompt_n_max": max(t.prompt_n for t in installs),
                "background_ms_max": round(max(t.prompt_ms for t in installs), 1)}
        report["system_change"] = bench.system_change(engine, system, users, sampling, config)
        progress.say("measured a system prompt change")
        report["raw_decode"] = bench.decode_speed(engine)
        if not args.no_abort:
            report["abort"] = {"decoding": bench.abort_while_decoding(engine),
                               "prefill": bench.abort_during_prefill(engine)}
        report["targets"] = targets(report)
    finally:
        engine.close()
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_report(report)
    return 0


def _gpu_layers(args: argparse.Namespace) -> str | int | None:
    value = args.gpu_layers
    return int(value) if value is not None and value.isdigit() else value


def targets(report: dict) -> list[dict]:
    """The issue's speed targets, evaluated on this run's numbers."""
    turns = report["turns"]
    checks = []

    def check(name: str, value, limit, ok: bool) -> None:
        checks.append({"target": name, "value": value, "limit": limit, "ok": bool(ok)})

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
    ratio = report["raw_decode"]["engine_speed_ratio"]
    check("engine decode speed / raw loop", ratio, 0.95, ratio >= 0.95)
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


def print_report(report: dict) -> None:
    print(f"model {report['model']} · {report['backend']} · n_ctx {report['n_ctx']}")
    header = f"{'turn':>4} {'cache_n':>7} {'prompt_n':>8} {'prompt_ms':>9} {'TTFT':>7} {'TPOT':>6} " \
             f"{'itl_p95':>7} {'tokens':>6} {'ctx':>5} {'trim':>5}"
    baseline = report.get("baseline", {}).get("turns")
    print(header + ("  fresh-context TTFT" if baseline else ""))
    for i, t in enumerate(report["turns"]):
        line = (f"{i + 1:>4} {t['cache_n']:>7} {t['prompt_n']:>8} {t['prompt_ms']:>9.0f} "
                f"{t['ttft_ms']:>7.0f} {t['tpot_ms']:>6.1f} {t['itl_p95_ms']:>7.1f} "
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
    raw = report["raw_decode"]
    print(f"decode: raw llama.cpp loop {raw['raw_ms_per_token']} ms/token, engine "
          f"{raw['engine_ms_per_token']} ms/token · engine speed ratio {raw['engine_speed_ratio']}")
    for c in report["targets"]:
        print(f"  [{'ok' if c['ok'] else 'MISS'}] {c['target']}: {c['value']} (limit {c['limit']})")


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"… {text}", file=sys.stderr, flush=True)
