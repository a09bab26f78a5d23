"""``localchat bench --router``: how well the escalation rules and the whole route score on a
labelled prompt set (``{"prompt": ..., "label": "local-ok" | "needs-remote"}`` per line).

``evaluate`` scores the rules of :mod:`localchat.remote.router` alone. ``simulate`` sends every
prompt through the same :class:`~localchat.remote.escalate.Escalator` as ``ask --route auto`` —
rules before generation, then the confidence monitor over the real local reply — with a stand-in
remote that answers at once, so what is measured is *when* each prompt would leave the machine
and how many local tokens were spent (thrown away) before it did: precision and recall of the
whole pipeline, the share of easy prompts kept local, escalations by the rules, by the monitor
within the first tokens, and late ones (after more than LATE_AFTER_TOKENS local tokens), and the
local tokens wasted per escalation.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.events import Done, Event
from localchat.remote.confidence import LATE_AFTER_TOKENS
from localchat.remote.router import decide, rule_score_for
from localchat.settings import Settings
from localchat.settings.remote import RemoteSettings, RouterThresholds

if TYPE_CHECKING:  # the rules alone (--rules-only) load neither llama.cpp nor the HTTP client
    from localchat.engine.engine import Engine
    from localchat.remote.escalate import TurnOutcome

LABEL_LOCAL = "local-ok"
LABEL_REMOTE = "needs-remote"


class _AnsweredAtOnce:
    """The stand-in remote's reply: nothing, finished. Nothing leaves the machine."""

    def __iter__(self) -> Iterator[Event]:
        yield Done("", "stop")

    def stop(self) -> None:
        pass


class _AlwaysUp:
    def allows_request(self) -> bool:
        return True

    def describe(self) -> str:
        return "stand-in remote"


class _StandInRemote:
    """What the escalator needs of a RemoteClient, answering every request at once."""

    breaker = _AlwaysUp()

    def stream(self, messages: list[dict], sampling: Sampling, *, route_reason: str = "") -> _AnsweredAtOnce:
        return _AnsweredAtOnce()

    def close(self) -> None:
        pass


def simulate(path: Path | str, engine: Engine, settings: RemoteSettings, sampling: Sampling,
             local_params: int | None) -> dict[str, Any]:
    """Route every prompt of the labelled file at ``path`` through ``engine`` (loaded, with
    ``track_confidence`` on) as mode ``auto`` would; return the pipeline's scores."""
    from localchat.remote.escalate import Escalator

    settings = replace(settings, mode="auto", base_url=settings.base_url or "http://stand-in.invalid")
    escalator = Escalator(settings, _StandInRemote())  # type: ignore[arg-type]
    rows = []
    for prompt, label in read_labelled(Path(path)):
        engine.reset()  # each prompt on its own: no cache from the one before
        messages = [{"role": "user", "content": prompt}]
        turn = escalator.start_turn(messages, partial(engine.submit, messages, sampling),
                                    sampling=sampling, local_params=local_params)
        for _ in turn:
            pass
        rows.append((prompt, label, turn.outcome))
    return score(rows)


def score(rows: list[tuple[str, str, TurnOutcome | None]]) -> dict[str, Any]:
    """The pipeline's numbers from (prompt, label, outcome) rows."""
    tp = fp = fn = tn = 0
    by_rules = early = late = late_hard = 0
    wasted: list[int] = []
    misrouted = []
    for prompt, label, outcome in rows:
        escalated = outcome is not None and outcome.escalated
        wanted = label == LABEL_REMOTE
        tp += escalated and wanted
        fp += escalated and not wanted
        fn += wanted and not escalated
        tn += not wanted and not escalated
        if outcome is not None and outcome.escalated:
            wasted.append(outcome.local_tokens)
            by_rules += outcome.local_partial is None
            early += outcome.local_partial is not None and not outcome.late
            late += outcome.late
            late_hard += outcome.late and wanted
        if escalated != wanted:
            misrouted.append({"prompt": prompt[:80], "label": label,
                              "route_reason": outcome.route_reason if outcome else ""})
    hard, easy = tp + fn, tn + fp
    return {
        "tp": tp, "fp": fp, "fn": fn, "tn": tn,
        "precision": _ratio(tp, tp + fp), "recall": _ratio(tp, hard),
        "easy_kept_local": _ratio(tn, easy),
        "escalated_by_rules": by_rules,
        f"escalated_within_{LATE_AFTER_TOKENS}_tokens": early,
        "late_escalations": late,
        "late_escalations_of_hard_prompts": late_hard,
        "tokens_wasted_per_escalation": round(statistics.fmean(wasted), 1) if wasted else 0.0,
        "tokens_wasted_max": max(wasted, default=0),
        "misrouted": misrouted,
    }


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 3) if whole else 0.0


def evaluate(path: Path | str, thresholds: RouterThresholds | None = None,
             local_params: int | None = None) -> dict[str, Any]:
    """Score the rules on a labelled JSONL file (``{"prompt": ..., "label": "local-ok" |
    "needs-remote"}`` per line), for ``localchat bench --router``, with the threshold for a local
    model of ``local_params`` parameters (None: unknown).

    "Positive" means needs-remote. Returns counts, ``precision``, ``recall``, ``f1``,
    ``easy_kept_local`` (the share of local-ok prompts the rules keep), the added latency of a
    decision (``mean_latency_ms``, ``max_latency_ms``: over prompts, each the median of five runs)
    and the misrouted prompts.
    """
    thresholds = thresholds or RouterThresholds()
    examples = read_labelled(Path(path))
    decide("warm-up", thresholds)  # first-call costs are not a per-turn cost
    tp = fp = fn = tn = 0
    latencies: list[float] = []
    misrouted: list[dict[str, Any]] = []
    for prompt, label in examples:
        decision = decide(prompt, thresholds, local_params=local_params)
        latencies.append(_decision_ms(prompt, thresholds, local_params))
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
        "easy_kept_local": round(tn / (tn + fp), 3) if tn + fp else 0.0,
        "threshold": rule_score_for(thresholds, local_params),
        "mean_latency_ms": round(statistics.fmean(latencies), 4) if latencies else 0.0,
        "max_latency_ms": round(max(latencies), 4) if latencies else 0.0,
        "misrouted": misrouted,
    }


def _decision_ms(prompt: str, thresholds: RouterThresholds, local_params: int | None,
                 runs: int = 5) -> float:
    """Median time of one decision over a few runs: the rules' cost, not a scheduler hiccup
    (on a busy machine single runs of a 0.1 ms decision occasionally take 10 ms)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        decide(prompt, thresholds, local_params=local_params)
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def read_labelled(path: Path) -> list[tuple[str, str]]:
    """(prompt, label) pairs of a labelled JSONL file; a bad file is a one-line UserError."""
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


def router_report(path: Path, model: str | None, config: Settings, *, rules_only: bool, n_ctx: int,
                  gpu_layers: str | int | None, temperature: float,
                  max_tokens: int | None) -> dict[str, Any]:
    """The rules' scores on the labelled set at ``path``; unless ``rules_only``, also the whole
    route (rules, then the confidence monitor over the local model's reply) with ``model``."""
    settings = config.remote
    if rules_only:
        params = _parameter_count(model, config)
        return {"set": str(path), "n_params": params, "rules": evaluate(path, settings.router, params)}
    from localchat.engine.factory import open_engine

    engine = open_engine(model, config, n_ctx=n_ctx, gpu_layers=gpu_layers, track_confidence=True)
    try:
        params = engine.preflight().n_params  # before the load: a bad file fails fast
        rules = evaluate(path, settings.router, params)
        info = engine.load()
        sampling = Sampling(temperature=temperature, max_tokens=max_tokens or 128,
                            seed=1 if temperature > 0 else -1)
        pipeline = simulate(path, engine, settings, sampling, params)
    finally:
        engine.close()
    return {"set": str(path), "model": info.model, "n_params": params,
            "temperature": temperature, "max_tokens": sampling.max_tokens,
            "rules": rules, "route": pipeline}


def _parameter_count(model: str | None, config: Settings) -> int | None:
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
