"""The app's ``/stats`` page for one stored conversation: sparklines of its replies' TTFT and TPOT,
then the route share and p50/p95 per model (the numbers are ``store.stats``'; this module only
draws them)."""

from __future__ import annotations

from localchat.store.stats import model_stats
from localchat.store.store import Store

BARS = "▁▂▃▄▅▆▇█"
TIMID_ROUTER_NOTE = ("The local share is the fast path's hit rate, the fallback share its degrade rate. "
                     "With a remote configured, a local share above ~90% can mean the router is too timid.")


def sparkline(values: list[float]) -> str:
    """One bar per value, scaled between the smallest and the largest (``▁`` … ``█``)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        return BARS[0] * len(values)
    return "".join(BARS[round((v - low) / (high - low) * (len(BARS) - 1))] for v in values)


def session_speed_markdown(store: Store, session_id: int, width: int = 60) -> str:
    """The ``/stats`` page: TTFT and TPOT of the session's last ``width`` local replies as
    sparklines, then the route share and p50/p95 per model for this session and for all sessions."""
    replies = [t.timings for t in store.turns(session_id)
               if t.role == "assistant" and t.timings and t.timings.predicted_n and t.route != "remote"]
    timings = [t for t in replies if t is not None][-width:]
    lines = ["# Speed", ""]
    if not timings:
        lines += ["_No local replies in this session yet._", ""]
    else:
        ttft = [t.ttft_ms for t in timings]
        tpot = [t.tpot_ms for t in timings]
        lines += [f"Last {len(timings)} local replies of this session, oldest first:", "", "```",
                  f"TTFT {sparkline(ttft)}  {min(ttft):,.0f}–{max(ttft):,.0f} ms",
                  f"TPOT {sparkline(tpot)}  {min(tpot):,.1f}–{max(tpot):,.1f} ms", "```", ""]
    for title, sid in (("This session", session_id), ("All sessions", None)):
        stats = model_stats(store, sid)
        lines += [f"## {title} (p50 / p95)", "", "| model | replies | TTFT ms | TPOT ms | ITL ms | reuse % |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {s.model} | {s.turns} | {s.ttft_ms} | {s.tpot_ms.p50:,.1f} / {s.tpot_ms.p95:,.1f} | {s.itl_ms} "
                  f"| {s.reuse_percent} |" for s in stats]
        lines += ["", "| model | TPOT p99 | TPOT SD | replies | local | escalated | fallback |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {s.model} | {s.tpot_ms.p99:,.1f} ms | {s.tpot_ms.std:,.1f} ms | {s.routes.replies} | "
                  + " | ".join(f"{share:.0f} %" for share in s.routes.percents()) + " |" for s in stats]
        lines.append("")
    lines.append(f"_{TIMID_ROUTER_NOTE}_")
    return "\n".join(lines)
