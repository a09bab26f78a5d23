"""A plain-text progress line for downloads on stderr: bytes, percent, rate and ETA.

On a terminal the line is redrawn in place (``\\r``) at most ten times a second; when stderr is a
file or a pipe a line is printed every few seconds instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from localchat.models.download import format_bytes


class TerminalProgress:
    """A ``progress(done, total)`` callback for :func:`localchat.models.download.pull`."""

    def __init__(self, label: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.clock = clock
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self._interval = 0.1 if self.interactive else 5.0
        self._start: tuple[float, int] | None = None  # (time, bytes) of the first report
        self._last_draw = float("-inf")
        self._width = 0
        self._last: tuple[int, int | None] = (0, None)

    def __call__(self, done: int, total: int | None) -> None:
        now = self.clock()
        if self._start is None:
            self._start = (now, done)  # bytes resumed from an earlier run do not count for rate
        self._last = (done, total)
        finished = total is not None and done >= total
        if finished or now - self._last_draw >= self._interval:
            self._last_draw = now
            self._draw(self.render(done, total, now))

    def render(self, done: int, total: int | None, now: float) -> str:
        parts = [self.label, format_bytes(done) + (f" / {format_bytes(total)}" if total else "")]
        if total:
            parts.append(f"{100 * done / total:3.0f}%")
        rate = self._rate(done, now)
        if rate > 0:
            parts.append(f"{format_bytes(rate)}/s")
            if total and done < total:
                parts.append(f"ETA {format_duration((total - done) / rate)}")
        return "  ".join(parts)

    def close(self) -> None:
        """End the line (call once, whatever happened)."""
        if self.interactive and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0

    def _rate(self, done: int, now: float) -> float:
        if self._start is None:
            return 0.0
        elapsed = now - self._start[0]
        return (done - self._start[1]) / elapsed if elapsed > 0 else 0.0

    def _draw(self, line: str) -> None:
        if self.interactive:
            padding = " " * max(0, self._width - len(line))
            self.stream.write("\r" + line + padding)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
