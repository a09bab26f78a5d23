"""``localchat bench --speculative [SET.jsonl]``: the same prompts with speculative decoding off
and on, interleaved in one run on one loaded model, so the ratios hold on a busy machine.

Each prompt (``{"kind": "edit" | "prose", "prompt": ...}`` per line; the shipped set holds code
edits, corrections, "repeat this list with one change", JSON rewrites, and prose) is answered on
an empty cache ``rounds`` times each way, off and on alternating (ABBA across rounds): tokens per
second each way, their ratio, how many tokens were drafted and accepted. Then exactness: greedy
replies must be identical, or differ only after a near-tie (the logits at the first differing
token, from a decode without speculation, within NEAR_TIE_LOGITS); and with temperature and a
fixed seed the reply must be the same (the engine does not draft such turns: ``seeded_draft_n``).
Beside each ratio: prompt lookup's ceiling on that reply, by hindsight (``lookup_ceiling``), at
the check costs this engine measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from localchat.bench.conversation import NEAR_TIE_LOGITS
from localchat.bench.lookup_ceiling import lookup_ceiling
from localchat.bench.script import read_rows, run_turn
from localchat.bench.targets import speculative_targets
from localchat.engine.engine import Engine
from localchat.engine.factory import open_engine
from localchat.engine.ngram import MAX_MATCH
from localchat.engine.options import Sampling
from localchat.engine.sampling.sampler import PENALTY_WINDOW
from localchat.errors import UserError
from localchat.events import Timings
from localchat.settings import Settings

KINDS = ("edit", "prose")
SEEDED_TEMPERATURE = 0.7
SEED = 1234


def shipped_set() -> Path:
    return Path(str(resources.files("localchat.bench").joinpath("data/speculative.jsonl")))


def read_set(path: Path) -> list[tuple[str, str]]:
    """(kind, prompt) per line of a prompt set; a bad file is a one-line UserError."""
    prompts = []
    for number, row in read_rows(path, "prompt set", ("kind", "prompt")):
        kind, prompt = row["kind"], row["prompt"]
        if kind not in KINDS or not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{path}:{number}: kind must be {' or '.join(KINDS)} and prompt a text")
        prompts.append((kind, prompt))
    return prompts


def measure_speculative(model: str | None, config: Settings, path: Path, *, mode: str,
                        draft_model: str | None, n_ctx: int, gpu_layers: str | int | None,
                        max_tokens: int, rounds: int, say: Callable[[str], None],
                        exact_pass: bool = True) -> dict[str, Any]:
    """Answer every prompt of the set at ``path`` with speculation off and in ``mode``; then
    (``exact_pass``) again where checks round as single decodes do, which must give identical
    replies. The report ``--json`` prints, its targets checked."""
    prompts = read_set(path)
    engine = open_engine(model, config, n_ctx=n_ctx, gpu_layers=gpu_layers, speculative=mode,
                         draft_model=draft_model)
    try:
        info = engine.load()
        if engine.speculation.startswith("off"):
            raise UserError(f"speculative decoding is not available for {info.model}: "
                            f"{engine.speculation}")
        greedy = Sampling(temperature=0.0, repeat_penalty=config.sampling.repeat_penalty,
                          max_tokens=max_tokens)
        seeded = replace(greedy, temperature=SEEDED_TEMPERATURE, seed=SEED)
        _answer(engine, "off", [{"role": "user", "content": "Hello!"}], greedy)  # warm-up
        rows = []
        is_end = set(engine.end_tokens()).__contains__  # a pass over the vocabulary: once
        for number, (kind, prompt) in enumerate(prompts, start=1):
            rows.append(_measure_prompt(engine, mode, kind, prompt, greedy, seeded, rounds, is_end))
            say(f"prompt {number}/{len(prompts)} ({kind}): {rows[-1]['ratio']}x")
        report: dict[str, Any] = {
            "model": info.model, "backend": info.backend, "gpu_layers": info.gpu_layers,
            "speculative": engine.set_speculative(mode), "set": str(path),
            "max_tokens": max_tokens, "rounds": rounds,
            "repeat_penalty": greedy.repeat_penalty, "prompts": rows,
            "summary": {kind: _summary([r for r in rows if r["kind"] == kind]) for kind in KINDS
                        if any(r["kind"] == kind for r in rows)},
        }
    finally:
        engine.close()
    if exact_pass:
        report["exact_kernels"] = _exact_pass(model, config, prompts, mode, draft_model, n_ctx,
                                              greedy, seeded)
        say("answered the set again with bit-exact kernels")
    report["targets"] = speculative_targets(report)
    return report


def _exact_pass(model: str | None, config: Settings, prompts: list[tuple[str, str]], mode: str,
                draft_model: str | None, n_ctx: int, greedy: Sampling,
                seeded: Sampling) -> dict[str, Any]:
    """Every prompt greedy and seeded, off and on, where a check's logits are a single decode's
    bit for bit (flash attention on one CPU thread, ``LlamaRuntime.exact_checks``; there the
    engine drafts seeded turns too): any difference would be the speculation's own fault."""
    engine = open_engine(model, config, n_ctx=n_ctx, gpu_layers=0, speculative=mode,
                         draft_model=draft_model, flash_attn=True, n_threads=1)
    identical = {"greedy": 0, "seeded": 0}
    drafted = 0
    try:
        engine.load()
        for _, prompt in prompts:
            messages = [{"role": "user", "content": prompt}]
            for name, sampling in (("greedy", greedy), ("seeded", seeded)):
                _, plain = _answer(engine, "off", messages, sampling)
                timings, checked = _answer(engine, mode, messages, sampling)
                identical[name] += plain == checked
                drafted += timings.draft_n
    finally:
        engine.close()
    return {"flash_attn": True, "n_threads": 1, "prompts": len(prompts),
            "greedy_identical": identical["greedy"], "seeded_identical": identical["seeded"],
            "draft_n": drafted}


def _answer(engine: Engine, mode: str, messages: list[dict[str, str]],
            sampling: Sampling) -> tuple[Timings, list[int]]:
    engine.set_speculative(mode)
    engine.reset()
    done, tokens = run_turn(engine.submit(messages, sampling))
    return done.timings, tokens


def _measure_prompt(engine: Engine, mode: str, kind: str, prompt: str, greedy: Sampling,
                    seeded: Sampling, rounds: int, is_end: Callable[[int], bool]) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    speed: dict[str, list[float]] = {"off": [], "on": []}
    replies: dict[str, list[list[int]]] = {"off": [], "on": []}
    drafted = accepted = 0
    for round_ in range(rounds):
        for side in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
            timings, tokens = _answer(engine, "off" if side == "off" else mode, messages, greedy)
            speed[side].append(timings.predicted_per_second)
            replies[side].append(tokens)
            if side == "on":
                drafted += timings.draft_n
                accepted += timings.draft_n_accepted
    off_tps, on_tps = statistics.median(speed["off"]), statistics.median(speed["on"])
    reference = replies["off"][0]
    verdicts = [_judge(engine, messages, reference, tokens, greedy) for tokens in replies["on"]]
    worst = max(verdicts, key=lambda v: ("identical", "near-tie", "wrong").index(v["verdict"]))
    _, seeded_off = _answer(engine, "off", messages, seeded)
    seeded_timings, seeded_on = _answer(engine, mode, messages, seeded)
    costs = engine.check_costs(MAX_MATCH)
    ceiling = lookup_ceiling(engine.fresh_prompt(messages), reference, lambda k: costs[k - 1], is_end)
    return {"kind": kind, "prompt": prompt[:60], "tokens": len(reference),
            "off_tokens_per_s": round(off_tps, 1), "on_tokens_per_s": round(on_tps, 1),
            "ratio": round(on_tps / off_tps, 3) if off_tps else 0.0,
            "lookup_ceiling": round(ceiling, 3),
            "draft_n": drafted, "draft_n_accepted": accepted,
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "greedy": worst, "seeded_same": seeded_off == seeded_on,
            "seeded_draft_n": seeded_timings.draft_n}


def _judge(engine: Engine, messages: list[dict[str, str]], off: list[int], on: list[int],
           sampling: Sampling) -> dict[str, Any]:
    """Whether a speculative greedy reply is the one decoding without it gave: identical, or
    first different after a near-tie, or wrong. A near-tie: at the first different token, the
    margin (in logits, the turn's repeat penalty applied) between the two choices is under
    NEAR_TIE_LOGITS under a decode without speculation, or under one that evaluates the reply
    in checks as speculation does (their kernels round differently: on the test model up to ~2
    logits apart from one-by-one decoding at some positions). A wrong cell or sample is a clear
    preference under all of them."""
    if on == off:
        return {"verdict": "identical"}
    i = next((k for k, (a, b) in enumerate(zip(off, on)) if a != b), min(len(off), len(on)))
    ends = engine.end_tokens() if i == min(len(off), len(on)) else []
    plain = _margin(engine.fresh_logits(messages, off[:i]), off, on, i, ends, sampling)
    checked = min(_margin(engine.fresh_logits(messages, on[:i], check_size=size),
                          off, on, i, ends, sampling) for size in CHECK_SIZES)
    verdict = "near-tie" if min(plain, checked) < NEAR_TIE_LOGITS else "wrong"
    return {"verdict": verdict, "token": i, "margin": round(plain, 4),
            "margin_as_checked": round(checked, 4)}


# Checks of these sizes over the whole reply stand in for the run's own (its exact schedule
# depends on timings): each rounds like checks do.
CHECK_SIZES = (2, 4, 8, 16)


def _margin(logits: np.ndarray, off: list[int], on: list[int], i: int, ends: list[int],
            sampling: Sampling) -> float:
    """How much the plain reply's token at ``i`` beats the speculative one's under ``logits``
    (negative: the speculative one wins). A reply that stopped there chose the likeliest end
    token."""
    logits = np.array(logits)
    if sampling.repeat_penalty != 1.0 and i:
        ids = np.array(sorted(set(off[max(0, i - PENALTY_WINDOW):i])), dtype=np.int64)
        values = logits[ids]
        logits[ids] = np.where(values <= 0, values * sampling.repeat_penalty,
                               values / sampling.repeat_penalty)
    end = max(ends, key=lambda t: logits[t]) if ends else -1
    return float(logits[off[i] if i < len(off) else end] - logits[on[i] if i < len(on) else end])


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    drafted = sum(r["draft_n"] for r in rows)
    accepted = sum(r["draft_n_accepted"] for r in rows)
    verdicts = [r["greedy"]["verdict"] for r in rows]
    return {"prompts": len(rows),
            "median_ratio": round(statistics.median(r["ratio"] for r in rows), 3),
            "min_ratio": min(r["ratio"] for r in rows),
            "median_lookup_ceiling": round(statistics.median(r["lookup_ceiling"] for r in rows), 3),
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "draft_n": drafted, "draft_n_accepted": accepted,
            "greedy_identical": verdicts.count("identical"),
            "greedy_near_tie": verdicts.count("near-tie"),
            "greedy_wrong": verdicts.count("wrong"),
            "seeded_same": sum(1 for r in rows if r["seeded_same"]),
            "seeded_draft_n": sum(r["seeded_draft_n"] for r in rows)}


def print_speculative(report: dict[str, Any]) -> None:
    """The report as a table of prompts, a line per kind, then the targets."""
    print(f"model {report['model']} · {report['backend']} · speculative {report['speculative']} · "
          f"{report['rounds']} rounds · max_tokens {report['max_tokens']}")
    print(f"{'kind':<6} {'tokens':>6} {'off tok/s':>9} {'on tok/s':>8} {'ratio':>6} {'ceiling':>7} "
          f"{'drafted':>7} {'accepted':>8} {'greedy':>9} {'seeded':>6}  prompt")
    for r in report["prompts"]:
        print(f"{r['kind']:<6} {r['tokens']:>6} {r['off_tokens_per_s']:>9} {r['on_tokens_per_s']:>8} "
              f"{r['ratio']:>6} {r['lookup_ceiling']:>7} {r['draft_n']:>7} {r['draft_n_accepted']:>8} "
              f"{r['greedy']['verdict']:>9} {'same' if r['seeded_same'] else 'DIFF':>6}  "
              f"{r['prompt'][:40]!r}")
    for kind, s in report["summary"].items():
        print(f"{kind}: median ratio {s['median_ratio']} (min {s['min_ratio']}; prompt lookup's "
              f"ceiling by hindsight {s['median_lookup_ceiling']}) · acceptance "
              f"{s['acceptance']} ({s['draft_n_accepted']}/{s['draft_n']}) · greedy "
              f"{s['greedy_identical']} identical, {s['greedy_near_tie']} near-tie, "
              f"{s['greedy_wrong']} wrong · seeded {s['seeded_same']}/{s['prompts']} same "
              f"({s['seeded_draft_n']} drafted)")
    exact = report.get("exact_kernels")
    if exact:
        print(f"bit-exact kernels (flash attention, 1 thread): greedy {exact['greedy_identical']}/"
              f"{exact['prompts']} and seeded {exact['seeded_identical']}/{exact['prompts']} "
              f"identical, {exact['draft_n']} tokens drafted")
    for check in report["targets"]:
        print(f"  [{'ok' if check['ok'] else 'MISS'}] {check['target']}: {check['value']} "
              f"(limit {check['limit']})")
