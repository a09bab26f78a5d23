"""Speed and routing over stored turns, per local model (``localchat stats`` prints them;
``chat.speed`` draws the app's ``/stats`` page).

Speed: percentiles of TTFT, TPOT, inter-token latency and cache reuse over the local replies, and
for TPOT also p99 and the standard deviation (jitter from one reply to the next). Routing: of
every reply the local model was in charge of, how many it answered itself, how many went to the
remote, and how many went there, failed and fell back to it. The hit rate is the local share
(the fast path), the degrade rate the fallback share.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from localchat.events import Timings
from localchat.percentiles import percentile
from localchat.store.records import TurnRecord
from localchat.store.store import Store


@dataclass(frozen=True)
class Spread:
    p50: float
    p95: float

    def __str__(self) -> str:
        return f"{self.p50:,.1f} / {self.p95:,.1f}"


@dataclass(frozen=True)
class TailSpread(Spread):
    """A spread that also shows its tail: p99, and the population standard deviation."""

    p99: float
    std: float

    def __str__(self) -> str:
        return f"{self.p50:,.1f} / {self.p95:,.1f} / {self.p99:,.1f}"


@dataclass(frozen=True)
class RouteShare:
    """Who answered the replies of one local model: itself (``local``), the remote
    (``escalated``, by the router or by the user), or itself after the remote failed
    (``fallback``)."""

    local: int = 0
    escalated: int = 0
    fallback: int = 0

    @property
    def replies(self) -> int:
        return self.local + self.escalated + self.fallback

    @property
    def hit_rate(self) -> float:
        """The fast path's share: replies the local model answered without the remote."""
        return self.local / self.replies if self.replies else 0.0

    @property
    def degrade_rate(self) -> float:
        """The share of replies that went to the remote, failed there and fell back."""
        return self.fallback / self.replies if self.replies else 0.0

    def percents(self) -> tuple[float, float, float]:
        """Local, escalated and fallback shares in percent (0s for no replies)."""
        total = self.replies or 1
        return 100 * self.local / total, 100 * self.escalated / total, 100 * self.fallback / total

    def __str__(self) -> str:
        return " / ".join(f"{p:.0f}" for p in self.percents()) if self.replies else "-"


@dataclass(frozen=True)
class ModelStats:
    """One local model: its measured local replies, p50/p95 of each measure (ms; reuse in %),
    and the route share of every reply it was in charge of."""

    model: str
    turns: int  # local replies that produced tokens: what the speed figures are over
    ttft_ms: Spread
    tpot_ms: TailSpread
    itl_ms: Spread  # p50 of the turns' median gaps / p95 of their 95th-percentile gaps
    reuse_percent: Spread  # share of each prompt served from the KV cache
    routes: RouteShare

    def to_dict(self) -> dict:
        routes = self.routes
        return {"model": self.model, "turns": self.turns,
                **{f"{name}_{p}": round(getattr(getattr(self, name), p), 2)
                   for name in ("ttft_ms", "tpot_ms", "itl_ms", "reuse_percent") for p in ("p50", "p95")},
                "tpot_ms_p99": round(self.tpot_ms.p99, 2), "tpot_ms_std": round(self.tpot_ms.std, 2),
                "replies": routes.replies, "replies_local": routes.local,
                "replies_escalated": routes.escalated, "replies_fallback": routes.fallback,
                "hit_rate": round(routes.hit_rate, 4), "degrade_rate": round(routes.degrade_rate, 4)}


def spread(values: list[float], high: list[float] | None = None) -> Spread:
    return Spread(percentile(values, 50), percentile(high if high is not None else values, 95))


def tail_spread(values: list[float]) -> TailSpread:
    return TailSpread(percentile(values, 50), percentile(values, 95), percentile(values, 99),
                      statistics.pstdev(values) if values else 0.0)


def local_model(turn: TurnRecord) -> str:
    """The local model in charge of a stored reply ("?" for a remote reply of unknown origin)."""
    return turn.local_model or (turn.model if turn.route != "remote" else "") or "?"


def model_stats(store: Store, session_id: int | None = None) -> list[ModelStats]:
    """Per local model, over the stored replies (of one session, or all): speed over the local
    replies that produced tokens, the route share over every reply."""
    timings: dict[str, list[Timings]] = {}
    routes: dict[str, list[int]] = {}  # local, escalated, fallback
    for turn in store.replies(session_id):
        model = local_model(turn)
        counts = routes.setdefault(model, [0, 0, 0])
        counts[2 if turn.fell_back else 1 if turn.route == "remote" else 0] += 1
        timings.setdefault(model, [])
        if turn.timings is not None and turn.timings.predicted_n and turn.route != "remote":
            timings[model].append(turn.timings)
    return [_stats(model, timings[model], RouteShare(*routes[model])) for model in sorted(routes)]


def _stats(model: str, timings: list[Timings], routes: RouteShare) -> ModelStats:
    decoded = [t for t in timings if t.predicted_n > 1]
    return ModelStats(
        model, len(timings),
        spread([t.ttft_ms for t in timings]),
        tail_spread([t.tpot_ms for t in decoded]),
        spread([t.itl_p50_ms for t in decoded], [t.itl_p95_ms for t in decoded]),
        spread([100 * t.cache_n / (t.cache_n + t.prompt_n) for t in timings if t.cache_n + t.prompt_n]),
        routes,
    )
