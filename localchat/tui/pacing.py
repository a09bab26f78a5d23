"""Pacing the redraws of a streaming reply: as often as the eye wants, as rarely as decode needs.

Whatever CPU the UI thread spends laying out and painting is taken from decoding when the
model's threads use every core (and the engine thread also waits for the GIL while the UI holds
it). Redrawing per token cost over 40% of decode speed with SmolLM2-135M on a 2-core CPU. So the
app redraws at most once per frame, and sets each frame's interval from what recent frames
cost: ``interval = clamp(frame cost / share, min_frame_s, max_frame_s)``, where the share of one
core the UI may use, and the bounds, depend on the hardware (``frame_budget``):

- **CPU-bound** (llama.cpp runs one thread per core, nothing on a GPU): share 10%, frames
  50–500 ms apart, and an open paragraph or code block keeps 2 blank rows below its text, so
  that the reply grows (and the log scrolls) once every 3 lines instead of every line.
- **A core to spare** (llama.cpp told to use fewer threads than there are CPUs, or every layer
  offloaded to a GPU): share 25%, frames 33–250 ms apart (30 a second at most), no blank rows.
- **Remote** (the reply comes from the remote model): share 50%, frames 33–250 ms apart.

The measurements behind it (SmolLM2-135M Q4_1, Textual 8, a 2-core Xeon shared with other
work, so each figure is a median of alternating runs):

- What a frame costs (``bench --tui``, proof tests): repainting the line being written ~6 ms of
  UI time whatever the reply's length (Textual repaints every widget the dirty line crosses, from
  cache); a frame that grows the reply ~20–30 ms for prose (the reply and the log are laid out
  and repainted whole), 45–80 ms when lists, tables and code are on screen (a widget per item
  and cell). The UI's cost grows with the text more than with the frame rate: ~0.8 ms of UI per
  token for a paragraph, ~4 ms for many Markdown blocks.
- What UI time costs decode, CPU-bound: the headless app over 600-token greedy replies (2
  threads on 2 cores, ~55 tokens/s): share 5% → decode 2.8–7.3% slower, frames p90 ~375 ms;
  10% → 9.2–9.5% slower, p90 110–120 ms; 20% → 8–16% slower, p90 ~55 ms. A Python thread
  holding the GIL for that share of every 100 ms beside a bare decode: 2% → 0.96 of the speed,
  10% → 0.91, 30% → 0.81. The first few per cent cost most (the GIL and a descheduled llama.cpp
  thread); 10% buys frames ~3× as often as 5% for ~4 points of decode speed.
- In a real terminal the app costs decode more than its share (``bench --tui --pty tmux
  --rounds 6``, 400-token replies, median of per-round ratios against ``ask``): share 10% →
  decode 0.79 of ``ask``, screen updates p50 65 / p90 105 ms; 5% → 0.86, p50 107 / p90 207 ms;
  10% with no keys pressed during the reply → 0.80, p90 85 ms. The rest is outside the UI
  thread's clock: Textual's writer thread, tmux parsing the output, and llama.cpp's threads
  waiting at their barriers while a core runs the UI. 10% stays: updates twice as often for
  about 7 points of decode, both far above reading speed.
- **The remote model answering** (a reply escalated or sent with route remote): share 50%,
  frames 33–250 ms apart, no blank rows. Nothing local decodes then, so the only CPU the UI
  takes is from other programs and the thread reading the stream. A remote reply is where
  lists, tables and code come most, and at the CPU-bound budget their frames stayed at the
  500 ms cap. The scripted 2,200-token many-block reply, headless 100×40: CPU-bound budget
  frames p90 529 ms, display lag p95 519 ms, the UI 17% of a core; this budget p90 43 ms, lag
  p95 82 ms, 42% of a core (a one-paragraph reply: p90 35 ms, lag 37 ms).
- A core to spare (llama.cpp on 1 thread of 2 cores): frames p90 36–48 ms in the app; a thread
  holding the GIL beside that decode: 10% → 0.93, 30% → 0.88, 50% → 0.74, so the share stays
  at 25%.
- Full garbage-collection passes took 90–135 ms with the GIL held, so they wait for the end of
  a reply (``FullCollectionsPaused``).
- Where a many-block frame goes (2,200-token scripted reply, headless 100×40, the late half):
  90–150 ms of UI time a frame, so frames sit at the 500 ms cap and the UI takes 25–35% of a
  core. About 60% of it is Textual's layout and paint: ~2 layouts a frame (the first changes
  widget sizes, and a changed virtual size asks for a second) at ~15 ms and ~3 paints at
  ~15–18 ms, with 30–42 widgets in view (a 4-row table is ~17 widgets, a 4-item list ~21) and
  45–80 laid out; building and mounting the finished blocks' widgets ~15%; young GC passes ~5%;
  parsing and the live blocks a few per cent. One ``batch_update`` around a whole frame did not
  change it (the second layout is Textual's own). The cost is in the widgets in view, not in the
  reply's length: at 10% a frame would have to cost 10 ms for 100 ms frames.
- Since then (same shapes, 2 runs each, idle): the second layout is gone (``laid_out_once``):
  one-paragraph layouts 70 → 42 in ~250 frames, frame interval p50 106 → 100 ms, p90 150 →
  131–139 ms, display lag p95 136–144 → 120–125 ms. Finished blocks wholly in view are drawn
  as one picture each (``pictures``): many-block frame CPU late in the reply ~130 → ~105 ms
  (early ~85 → ~80); its frames stay at the 500 ms cap, since each frame still mounts the new
  blocks' widgets (~2 layouts a frame).
- Time the UI spends between frames comes out of the same share: with the prompt's cursor
  blinking (a ~3 ms repaint twice a second), the status bar repainting 4 times a second and the
  prompt, status bar and footer rendered on every repaint of the log (Textual renders each
  widget whose container overlaps a repaint), the one-paragraph shape's frames were p50
  111–121 / p90 152–164 ms; without them (cursor still, status twice a second, those widgets in
  containers of their own) p50 86–92 / p90 123–124 ms, A/B on an idle machine.
- The estimate is the median of a reply's first 20 frames, then a running estimate that weighs
  each frame 0.05: the frame that resizes the reply is paid for over the next ~20 frames
  instead of stretching the next few. The reply's first two frames are not counted: the first
  lays the new reply out (40–50 ms) and the second, below a long conversation, folds away the
  turns it pushed up (~25 ms). Counted, they set the next intervals to 170–250 ms, and in a
  600-token reply below 50 stored turns those few slow frames made the display lag's p95:
  99–167 ms in six runs, 65–88 ms in three without them (frames' max interval 220–280 → 72–125
  ms). Until the third frame's cost is known, frames come at the budget's shortest interval.
- The floor of a many-block frame at this budget (scratch prototypes, 2,200-token scripted
  reply, headless 100×40, one run each): today's widgets mount a block, list item or table row
  almost every frame, ~2 layouts a frame at 27–37 ms each, so frames cost 50–115 ms and sit at
  the 500 ms cap (showing an open table's complete rows only: 47–93 ms, still capped). The
  whole reply drawn by one widget, each finished block rendered once by Rich and the open one
  again each frame: 8–11 ms a frame, p90 176 ms with 2 blank rows, 135 ms with 5 or 10. The
  same widget with the open block drawn as plain text (no Markdown work at all): p90 152 ms with
  2 rows, 97 ms with 5. So a stream of lists and tables reaches 100 ms frames here only drawn by
  one widget whose open block costs almost nothing, and ending in Textual's widgets means that
  renderer must draw lists, tables, headings and code as they do, cell for cell.
  Those cells can come from Textual itself: a finished block mounted hidden and laid out by a
  private ``Compositor`` (the screen's ``find_widget`` answering for it meanwhile) paints the
  same cells as on screen, heading to table, in 1–19 ms a block. But a prototype that showed
  every settled block that way, and open lists and tables as their raw text, still cost
  55–65 ms a frame late in the reply (8 ms early), frames at the cap: building a block's
  widgets and their CSS (~1 ms a widget) made a settle 20–30 ms, and the screen's own layout
  and paint with ~25 widgets in view ~18 ms.
- Why no pacing rule gets that reply's frames under the cap at this budget: a pacer that grants
  the UI ``share`` of a core keeps up only while the UI's CPU per token shown × tokens a second
  stays under ``share``; above it each longer frame carries more text, costs more, and the
  frames stretch to ``max_frame_s``. Measured with frames forced to a fixed interval and no
  share limit (the scripted 2,200-token replies at 80 tokens/s, headless 100×40, idle): the
  many-block reply every 100 ms took 28.7% of a core (3.6 ms of UI per token), every 200 ms
  22.6% (2.8 ms), every 500 ms 13.4% (1.7 ms); the one-paragraph reply every 100 ms 5.8% (0.73
  ms). So the many-block reply needs more than the CPU-bound 10% even in half-second frames,
  and at 100 ms frames 29%, where decode would keep ~0.8 of its speed (above). Its frame CPU
  late ÷ early (7–10 at this budget) is the text a frame carries (4 tokens early, 40 late; CPU
  per token falls from 3.4 to 1.6 ms); at the remote budget, 3 tokens a frame throughout, it is
  1.1–1.5. ``bench --tui`` prints both figures for each reply (UI %core, cpu/token).
- Tried and dropped: llama.cpp's OpenMP threads sleeping at once instead of spinning at their
  barriers (``OMP_WAIT_POLICY=PASSIVE``: decode alone 52 → 35 tokens/s; a short spin,
  ``GOMP_SPINCOUNT=20000``: 38 tokens/s, so the core they spin on is not what the UI lacks);
  collecting the young generation less often while streaming (thresholds 10,000 and 50,000
  instead of 700: more collector time in all, and single passes of 80–290 ms).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Weight of the newest frame's cost in the running estimate: low, so that the frame that resized
# the reply (2-3x the cost of one that repaints a line, every few frames) is paid for over the
# next ~20 frames, not by stretching the next few: the one-paragraph bench shape's frame
# interval p90 107-114 ms at 0.2, 89-102 ms at 0.05 (p50 ~80 ms at both, the same share).
COST_SMOOTHING = 0.05
# Until then the estimate is the median of the reply's frames so far: a frame that resizes the
# reply costs 2-3x one that repaints a line, and a mean would hold the next frames back.
WARM_UP_FRAMES = 20
# The reply's first frames lay out what is new (the reply, then the turns it pushes up folded
# away): one-time costs, not the stream's pace, so they are left out of the estimate.
UNCOUNTED_FRAMES = 2


@dataclass(frozen=True)
class FrameBudget:
    """How much the UI may spend on a streaming reply: ``share`` of one core, frames between
    ``min_frame_s`` and ``max_frame_s`` apart; ``slack_rows`` kept below an open paragraph or
    code block, so that the reply resizes less often."""

    name: str
    share: float
    min_frame_s: float
    max_frame_s: float
    slack_rows: int = 0


CPU_BOUND = FrameBudget("cpu-bound", share=0.10, min_frame_s=0.05, max_frame_s=0.5, slack_rows=2)
SPARE_CORE = FrameBudget("spare-core", share=0.25, min_frame_s=1 / 30, max_frame_s=0.25)
REMOTE = FrameBudget("remote", share=0.5, min_frame_s=1 / 30, max_frame_s=0.25)


def frame_budget(decode_threads: int, cpus: int, gpu_layers: int = 0, n_layers: int = 0,
                 backend: str = "CPU") -> FrameBudget:
    """The budget for a model decoding with ``decode_threads`` llama.cpp threads (0: one per
    physical core) on ``cpus`` logical CPUs, ``gpu_layers`` of its ``n_layers`` offloaded."""
    on_gpu = backend != "CPU" and n_layers > 0 and gpu_layers >= n_layers
    if on_gpu or 0 < decode_threads < cpus:
        return SPARE_CORE
    return CPU_BOUND


def route_budget(engine: object, route: str) -> FrameBudget:
    """The budget while the reply comes from ``route``: the remote model's text costs this
    machine only its drawing (llama.cpp is not decoding), else ``engine_budget``."""
    return REMOTE if route == "remote" else engine_budget(engine)


def engine_budget(engine: object) -> FrameBudget:
    """``frame_budget`` for a loaded engine (a scripted one counts as CPU-bound; the remote
    model's answers have their own budget, ``route_budget``)."""
    options = getattr(engine, "options", None)
    info = getattr(engine, "info", None)
    threads = int(getattr(options, "n_threads", 0) or 0)
    if info is None:
        return frame_budget(threads, available_cpus())
    return frame_budget(threads, available_cpus(), info.gpu_layers, info.n_layers, info.backend)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class FramePacer:
    """Decides when the next redraw may happen, from the UI thread's CPU time so far.

    Call ``start()`` when a reply starts, ``wait()`` to learn how long to hold off the next redraw
    and ``frame()`` when redrawing. All calls come from the UI thread (``thread_time`` measures
    the calling thread's CPU time, which includes Textual's layout and paint of the last frame).
    """

    def __init__(
        self,
        budget: FrameBudget = CPU_BOUND,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.budget = budget
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cpu_mark = 0.0
        self._cost: float | None = None
        self._first: list[float] = []  # the first frames' costs, while they set the estimate
        self._frames = 0  # frames of this reply started so far
        self._next_frame_at = 0.0
        self.interval = 0.0  # the wait the last frame set

    def start(self) -> None:
        self._cpu_mark = self._cpu_clock()
        self._cost = None
        self._first = []
        self._frames = 0
        self._next_frame_at = 0.0

    def wait(self) -> float:
        """Seconds until the next redraw is due (0 if it may happen now)."""
        return max(0.0, self._next_frame_at - self._clock())

    def frame(self) -> None:
        """A redraw starts now: the CPU spent since the previous one sets the next interval."""
        cpu = self._cpu_clock()
        spent, self._cpu_mark = cpu - self._cpu_mark, cpu
        # ``spent`` is the cost of frame number ``_frames`` (0: the time before the first).
        counted = self._frames > UNCOUNTED_FRAMES
        self._frames += 1
        if not counted:
            cost = 0.0  # the shortest interval
        elif len(self._first) < WARM_UP_FRAMES:
            self._first.append(spent)
            cost = statistics.median(self._first)
        else:
            assert self._cost is not None
            cost = COST_SMOOTHING * spent + (1 - COST_SMOOTHING) * self._cost
        self._cost = cost
        budget = self.budget
        self.interval = min(budget.max_frame_s, max(budget.min_frame_s, cost / budget.share))
        self._next_frame_at = self._clock() + self.interval


class FullCollectionsPaused:
    """While a reply streams, Python's garbage collector skips full (oldest-generation) passes.

    A full pass walks every live object, and a streaming app holds many (widgets, the strips of
    frozen lines): measured at 90–135 ms each, two or three times in a 2,200-token reply, with
    the GIL held, so the screen and the engine's thread both stood still. The young generations
    are still collected (the widgets a frame parses and throws away die young), so garbage does
    not pile up; the oldest generation gets its pass when the reply has ended.
    """

    FULL_PASS_NEVER = 1 << 30

    def __init__(self) -> None:
        self._thresholds: tuple[int, int, int] | None = None

    def pause(self) -> None:
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            young, middle, _ = self._thresholds
            gc.set_threshold(young, middle, self.FULL_PASS_NEVER)

    def resume(self) -> None:
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
