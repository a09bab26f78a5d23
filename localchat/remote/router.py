"""Rules that send a prompt to the remote before any local generation (mode ``auto``).

Two kinds of rule:

- **Fit**: the prompt alone does not fit the room the local context has for it, even after the
  session trimmed the history (the caller says how much room there is).
- **Hard task**: features that predict a task a small model fails at — long multi-part
  instructions, requests for step-by-step reasoning, proofs and derivations, writing or fixing
  code, many constraints, open-ended analysis. Each feature adds a weight; a total at or above
  ``RouterThresholds.rule_score`` escalates.

Everything is regular expressions over the prompt text, compiled once: a decision costs well
under a millisecond (``evaluate`` measures it on the labelled set in tests/data).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import UserError
from localchat.remote.context import estimate_tokens
from localchat.remote.settings import RouterThresholds

LABEL_LOCAL = "local-ok"
LABEL_REMOTE = "needs-remote"


@dataclass(frozen=True)
class RouteDecision:
    """The rules' verdict. ``reason`` is one line for the status bar and the chat log."""

    escalate: bool
    reason: str
    score: float = 0.0
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Feature:
    name: str  # as the user reads it in route_reason
    pattern: re.Pattern[str]
    weight: float
    # Each further match adds this much more (capped), for features where "how many" matters.
    per_extra: float = 0.0
    cap: float = 0.0


# The labelled calibration set (local-ok / needs-remote) that `localchat bench --router` scores.
LABELLED_PROMPTS = Path(__file__).parent / "data" / "router_prompts.jsonl"


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.MULTILINE)


_FEATURES: tuple[_Feature, ...] = (
    _Feature("step-by-step reasoning",
             _rx(r"step[- ]by[- ]step|show (?:all )?(?:your|the) (?:work|steps|reasoning)|"
                 r"walk me through|explain (?:your|the) reasoning|justify (?:each|every|your)"), 2.0),
    _Feature("proof or derivation",
             _rx(r"\b(?:prove|proof|derive|derivation|show that|theorem|lemma|closed[- ]form|"
                 r"integral|integrate|differentiate|eigen\w*|asymptotic|big[- ]o|recurrence|"
                 r"induction|expected value|probability that)\b"), 2.0),
    _Feature("math notation",
             _rx(r"\\(?:frac|sum|int|sqrt|lim)|[∑∫√≤≥≠∞]|\b[a-z]\^\d|"
                 r"\b\d+\s*[*/^]\s*\d+\s*[*/^+-]"), 1.0),
    _Feature("code to write or fix",
             _rx(r"\b(?:implement|refactor|debug|optimi[sz]e|write (?:a |an |the )?(?:\w+ ){0,3}"
                 r"(?:function|program|script|class|module|query|parser|server|test|algorithm|"
                 r"regex|api)|fix (?:this|the|my) (?:bug|code|function|error|query)|"
                 r"thread[- ]safe|time complexity|unit tests?|include tests)\b"), 1.5,
             per_extra=0.5, cap=1.0),
    _Feature("code in the prompt",
             _rx(r"```|^\s*(?:def |class |import |#include|public |fn |func |SELECT )|[;{}]\s*$"), 1.0),
    _Feature("analysis or design",
             _rx(r"\b(?:compare|contrast|analy[sz]e|analysis|evaluate|trade[- ]?offs?|pros and cons|"
                 r"architecture|design (?:a|an|the)|strategy|critique|in depth|comprehensive|"
                 r"detailed plan|migration plan)\b"), 1.0, per_extra=0.5, cap=1.0),
    _Feature("asks for a detailed explanation",
             _rx(r"\b(?:explain (?:in detail|why|how|the (?:causes|difference))|in detail|"
                 r"what are my rights|how .{3,40} affects?|key arguments)\b"), 1.0),
    _Feature("many constraints",
             _rx(r"\b(?:must|should|without|at least|at most|no more than|exactly|ensure|make sure|"
                 r"do not|don't|never|only use|each|every|under \d+|within \d+)\b"), 0.0,
             per_extra=0.5, cap=2.5),
    _Feature("multi-part instructions",
             _rx(r"^\s*(?:\d+[.)]|[-*•]|[a-h][.)])\s+\S|\b(?:first|second|third|then|finally|also|"
                 r"additionally|and then)\b[, ]"), 0.0, per_extra=0.5, cap=2.5),
)

# Word counts at which a prompt's length alone starts to count.
_MEDIUM_WORDS, _LONG_WORDS, _VERY_LONG_WORDS = 30, 80, 200
_SHORT_WORDS = 10


def decide(
    prompt: str,
    thresholds: RouterThresholds | None = None,
    *,
    local_room_tokens: int | None = None,
    prompt_tokens: int | None = None,
) -> RouteDecision:
    """Should ``prompt`` go to the remote before the local model tries?

    ``local_room_tokens``: how many prompt tokens the local context can take for this turn after
    trimming (context size minus system prompt, summary and reply reserve); None skips the fit
    rule. ``prompt_tokens``: the prompt's size from the local tokenizer, if the caller has it
    (otherwise estimated from characters).
    """
    thresholds = thresholds or RouterThresholds()
    if local_room_tokens is not None:
        size = prompt_tokens if prompt_tokens is not None else estimate_tokens(prompt)
        if size > local_room_tokens * thresholds.local_fit_fraction:
            return RouteDecision(True, f"prompt (~{size} tokens) does not fit the local context "
                                       f"({local_room_tokens} tokens free)", float("inf"), ("fit",))
    score, features = _score(prompt)
    escalate = score >= thresholds.rule_score
    named = ", ".join(features) if features else "no hard-task features"
    relation = ">=" if escalate else "<"
    return RouteDecision(escalate, f"{named} (score {score:g} {relation} {thresholds.rule_score:g})",
                         score, features)


def _score(prompt: str) -> tuple[float, tuple[str, ...]]:
    total, named = 0.0, []
    for feature in _FEATURES:
        hits = len(feature.pattern.findall(prompt))
        if not hits:
            continue
        extra = min(feature.cap, feature.per_extra * (hits - 1)) if feature.per_extra else 0.0
        points = feature.weight + extra
        if points > 0:
            total += points
            named.append(feature.name)
    words = len(prompt.split())
    if words >= _VERY_LONG_WORDS:
        total += 2.0
        named.append("very long prompt")
    elif words >= _LONG_WORDS:
        total += 1.0
        named.append("long prompt")
    elif words >= _MEDIUM_WORDS:
        total += 0.5  # not a feature of its own: only tips a prompt that already has one
    elif words < _SHORT_WORDS:
        total -= 0.5  # a short question is rarely a hard task, whatever words it uses
    return round(total, 2), tuple(named)


def evaluate(path: Path | str, thresholds: RouterThresholds | None = None) -> dict:
    """Score the rules on a labelled JSONL file (``{"prompt": ..., "label": "local-ok" |
    "needs-remote"}`` per line), for ``localchat bench --router``.

    "Positive" means needs-remote. Returns counts, ``precision``, ``recall``, ``f1``, the added
    latency of a decision (``mean_latency_ms``, ``max_latency_ms``: over prompts, each the median
    of five runs) and the misrouted prompts.
    """
    thresholds = thresholds or RouterThresholds()
    examples = _read_labelled(Path(path))
    decide("warm-up", thresholds)  # first-call costs are not a per-turn cost
    tp = fp = fn = tn = 0
    latencies: list[float] = []
    misrouted: list[dict] = []
    for prompt, label in examples:
        decision = decide(prompt, thresholds)
        latencies.append(_decision_ms(prompt, thresholds))
        wanted = label == LABEL_REMOTE
        if decision.escalate and wanted:
            tp += 1
        elif decision.escalate:
            fp += 1
        elif wanted:
            fn += 1
        else:
            tn += 1
        if decision.escalate != wanted:
            misrouted.append({"prompt": prompt[:80], "label": label, "score": decision.score})
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "n": len(examples), "tp": tp, "fp": fp, "fn": fn, "tn": tn,
        "precision": round(precision, 3), "recall": round(recall, 3), "f1": round(f1, 3),
        "threshold": thresholds.rule_score,
        "mean_latency_ms": round(statistics.fmean(latencies), 4) if latencies else 0.0,
        "max_latency_ms": round(max(latencies), 4) if latencies else 0.0,
        "misrouted": misrouted,
    }


def _decision_ms(prompt: str, thresholds: RouterThresholds, runs: int = 5) -> float:
    """Median time of one decision over a few runs: the rules' cost, not a scheduler hiccup
    (on a busy 2-core machine single runs of a 0.1 ms decision occasionally take 10 ms)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        decide(prompt, thresholds)
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def _read_labelled(path: Path) -> list[tuple[str, str]]:
    examples = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the labelled prompts: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, label = row["prompt"], row["label"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{path}:{number}: expected {{\"prompt\": ..., \"label\": ...}}") from None
        if label not in (LABEL_LOCAL, LABEL_REMOTE):
            raise UserError(f"{path}:{number}: label must be {LABEL_LOCAL!r} or {LABEL_REMOTE!r}")
        examples.append((prompt, label))
    return examples
