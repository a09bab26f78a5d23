"""Pacing the redraws of a streaming reply so that the UI never slows the model down.

On a small machine the model's threads use every core; whatever CPU the UI thread spends
re-laying out and repainting the screen is taken from decoding (and the engine thread also
waits for the GIL while the UI holds it). Redrawing per token cost over 40% of decode speed
with SmolLM2-135M on a 2-core CPU. So the app redraws a streaming reply at most once per frame, and
stretches the frame when redrawing is expensive (a long chat with many Markdown blocks), keeping
the UI thread's share of one core under a budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The UI thread may use this fraction of one core while a reply streams.
UI_CPU_BUDGET = 0.05
MIN_FRAME_S = 0.05  # 20 redraws a second at most: smooth to read
MAX_FRAME_S = 0.5  # the screen never lags the model by more than this


class FramePacer:
    """Decides when the next redraw may happen, from the UI thread's CPU time so far.

    Call ``start()`` when a reply starts, ``wait()`` to learn how long to hold off the next redraw
    and ``frame()`` when redrawing. All calls come from the UI thread (``thread_time`` measures
    the calling thread's CPU time, which includes Textual's layout and paint of the last frame).
    """

    def __init__(
        self,
        budget: float = UI_CPU_BUDGET,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.budget = budget
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cpu_mark = 0.0
        self._next_frame_at = 0.0

    def start(self) -> None:
        self._cpu_mark = self._cpu_clock()
        self._next_frame_at = 0.0

    def wait(self) -> float:
        """Seconds until the next redraw is due (0 if it may happen now)."""
        return max(0.0, self._next_frame_at - self._clock())

    def frame(self) -> None:
        """A redraw starts now: the CPU spent since the previous one sets the next interval."""
        cpu = self._cpu_clock()
        spent, self._cpu_mark = cpu - self._cpu_mark, cpu
        interval = min(MAX_FRAME_S, max(MIN_FRAME_S, spent / self.budget))
        self._next_frame_at = self._clock() + interval
