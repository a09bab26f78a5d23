"""How steadily the headless app shows a streaming reply: when the engine emitted each token,
when each frame started and ended (and the UI thread's CPU time then), and when the screen was
painted; then the intervals between frames, the display lag of each token and the UI CPU one
frame cost early and late in the reply.

A token's display lag runs from the engine emitting it to the first paint after the frame that
showed it (headless, a paint is the compositor's update, what would be written to the terminal).
A frame's CPU is the UI thread's CPU time from its start to the next frame's start: its event
handling, layout and paint, as ``tui/pacing.py`` counts it. Over the whole stream the UI's share
of a core and its CPU per token shown say whether any frame rate fits a budget: a pacer that
gives the UI ``share`` of a core keeps up only while CPU per token × tokens per second < share
(else each longer frame carries more text, costs more, and the frames stretch to the cap).
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localchat.percentiles import percentile

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp

EARLY_TOKENS = (50, 200)  # frames showing this many tokens count as "early" (~100 tokens)
LATE_TOKENS = (1800, 2200)  # ... and as "late" (~2,000 tokens)


@dataclass
class Frame:
    started: float
    ended: float
    cpu: float  # UI thread CPU time at its start
    tokens: int  # tokens shown once it ended


@dataclass
class FrameLog:
    """Filled while one reply streams through an app (``watch``) and its engine (``token``)."""

    emitted: list[float] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    paints: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def token(self) -> None:
        """The engine emitted the next token (any thread)."""
        with self._lock:
            self.emitted.append(time.perf_counter())

    def paint(self) -> None:
        self.paints.append(time.perf_counter())

    def watch(self, app: LocalChatApp) -> None:
        """Note each frame of ``app``'s streaming turns."""
        turns = app.turns
        show = turns._show_events

        async def frame(turn: Any) -> None:
            started, cpu = time.perf_counter(), time.thread_time()
            await show(turn)
            self.frames.append(Frame(started, time.perf_counter(), cpu, turn.meter.tokens))

        turns._show_events = frame  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        """Frame interval p50/p90/max, display lag p95 and frame CPU early/late, in ms; the UI's
        share of one core from the first frame to the last, and its CPU per token shown."""
        frames = [f for f in self.frames if f.tokens > 0]
        intervals = [(b.started - a.started) * 1000 for a, b in zip(frames, frames[1:])]
        cpu = [((b.cpu - a.cpu) * 1000, a.tokens) for a, b in zip(frames, frames[1:])]
        early = [ms for ms, n in cpu if EARLY_TOKENS[0] <= n <= EARLY_TOKENS[1]]
        late = [ms for ms, n in cpu if LATE_TOKENS[0] <= n <= LATE_TOKENS[1]]
        lags = self._lags(frames)
        result: dict[str, Any] = {
            "tokens": len(self.emitted),
            "frames": len(frames),
            "frame_interval_p50_ms": _ms(percentile(intervals, 50)),
            "frame_interval_p90_ms": _ms(percentile(intervals, 90)),
            "frame_interval_max_ms": _ms(max(intervals, default=0.0)),
            "display_lag_p95_ms": _ms(percentile(lags, 95)),
            "frame_cpu_early_ms": _ms(statistics.median(early)) if early else None,
            "frame_cpu_late_ms": _ms(statistics.median(late)) if late else None,
        }
        ui_cpu = span = 0.0
        shown = 0
        if len(frames) > 1:
            first, last = frames[0], frames[-1]
            ui_cpu, span, shown = last.cpu - first.cpu, last.started - first.started, last.tokens - first.tokens
        result["ui_core_percent"] = round(100 * ui_cpu / span, 1) if span > 0 else None
        result["ui_cpu_per_token_ms"] = round(1000 * ui_cpu / shown, 2) if shown > 0 else None
        if early and late:
            result["frame_cpu_late_over_early"] = round(statistics.median(late) / statistics.median(early), 2)
        return result

    def _lags(self, frames: list[Frame]) -> list[float]:
        """Per token: ms from its emission to the first paint after the frame that showed it."""
        paints, lags = sorted(self.paints), []
        shown_by = [f.tokens for f in frames]
        for index, emitted in enumerate(self.emitted):
            f = bisect.bisect_left(shown_by, index + 1)
            if f == len(frames):
                continue  # shown by the final render, after streaming
            p = bisect.bisect_left(paints, frames[f].ended)
            if p < len(paints):
                lags.append((paints[p] - emitted) * 1000)
        return lags


def _ms(value: float) -> float:
    return round(value, 1)
