"""``localchat bench --router`` with the local model: every prompt of a labelled set goes through
the same :class:`~localchat.remote.escalate.Escalator` as ``ask --route auto`` — rules before
generation, then the confidence monitor over the real local reply — with a stand-in remote that
answers at once, so what is measured is *when* each prompt would leave the machine and how many
local tokens were spent (thrown away) before it did.

Reported beside the rules-only scores of :func:`localchat.remote.router.evaluate`: precision and
recall of the whole pipeline, the share of easy prompts kept local, escalations by the rules, by
the monitor within the first tokens, and late ones (after more than LATE_AFTER_TOKENS local
tokens), and the local tokens wasted per escalation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from localchat.engine.options import Sampling
from localchat.events import Done, Event
from localchat.remote.confidence import LATE_AFTER_TOKENS
from localchat.remote.escalate import Escalator, TurnOutcome
from localchat.remote.router import LABEL_REMOTE, read_labelled
from localchat.remote.settings import RemoteSettings


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


def simulate(path: Path | str, engine, settings: RemoteSettings, sampling: Sampling,
             local_params: int | None) -> dict:
    """Route every prompt of the labelled file at ``path`` through ``engine`` (loaded, with
    ``track_confidence`` on) as mode ``auto`` would; return the pipeline's scores."""
    settings = replace(settings, mode="auto", base_url=settings.base_url or "http://stand-in.invalid")
    escalator = Escalator(settings, _StandInRemote())  # type: ignore[arg-type]
    rows = []
    for prompt, label in read_labelled(Path(path)):
        engine.reset()  # each prompt on its own: no cache from the one before
        messages = [{"role": "user", "content": prompt}]
        turn = escalator.start_turn(messages, lambda messages=messages: engine.submit(messages, sampling),
                                    sampling=sampling, local_params=local_params)
        for _ in turn:
            pass
        rows.append((prompt, label, turn.outcome))
    return score(rows)


def score(rows: list[tuple[str, str, TurnOutcome | None]]) -> dict:
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
        if escalated:
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
