"""Speed over stored turns: percentiles of TTFT, TPOT, inter-token latency and cache reuse per
model (``localchat stats`` prints them; ``chat.speed`` draws the app's ``/stats`` page)."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.events import Timings
from localchat.percentiles import percentile
from localchat.store.store import Store


@dataclass(frozen=True)
class Spread:
    p50: float
    p95: float

    def __str__(self) -> str:
        return f"{self.p50:,.1f} / {self.p95:,.1f}"


@dataclass(frozen=True)
class ModelStats:
    """One model's local replies: how many, and p50/p95 of each measure (ms; reuse in %)."""

    model: str
    turns: int
    ttft_ms: Spread
    tpot_ms: Spread
    itl_ms: Spread  # p50 of the turns' median gaps / p95 of their 95th-percentile gaps
    reuse_percent: Spread  # share of each prompt served from the KV cache

    def to_dict(self) -> dict:
        return {"model": self.model, "turns": self.turns,
                **{f"{name}_{p}": round(getattr(getattr(self, name), p), 2)
                   for name in ("ttft_ms", "tpot_ms", "itl_ms", "reuse_percent") for p in ("p50", "p95")}}


def spread(values: list[float], high: list[float] | None = None) -> Spread:
    return Spread(percentile(values, 50), percentile(high if high is not None else values, 95))


def model_stats(store: Store, session_id: int | None = None) -> list[ModelStats]:
    """Per model, over the stored local replies that produced tokens (of one session, or all)."""
    by_model: dict[str, list[Timings]] = {}
    for turn in store.replies(session_id):
        if turn.timings is not None and turn.timings.predicted_n and turn.route != "remote":
            by_model.setdefault(turn.model or "?", []).append(turn.timings)
    return [_stats(model, timings) for model, timings in sorted(by_model.items())]


def _stats(model: str, timings: list[Timings]) -> ModelStats:
    decoded = [t for t in timings if t.predicted_n > 1]
    return ModelStats(
        model, len(timings),
        spread([t.ttft_ms for t in timings]),
        spread([t.tpot_ms for t in decoded]),
        spread([t.itl_p50_ms for t in decoded], [t.itl_p95_ms for t in decoded]),
        spread([100 * t.cache_n / (t.cache_n + t.prompt_n) for t in timings if t.cache_n + t.prompt_n]),
    )
