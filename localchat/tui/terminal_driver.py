"""The app's terminal driver: Textual's own, made to outlive the terminal it draws on.

When the terminal's window is closed, writing to it fails (EIO) and reading it fails or returns
nothing. Textual's writer thread dies on the first failed write, after which its bounded queue
fills and the next frame blocks the UI thread for ever; its input thread turns a failed read into
a crash screen. Either stops the app before it can save the reply it was writing (the SIGHUP that
follows asks it to, see ``localchat.ending``). Here a failed write is dropped and a failed read
ends the input, so the app goes on to quit as Ctrl+Q does.
"""

from __future__ import annotations

import logging
from typing import IO, Any

from textual.drivers.linux_driver import LinuxDriver

log = logging.getLogger(__name__)


class TerminalDriver(LinuxDriver):
    """``LinuxDriver`` whose output and input survive a terminal that went away."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._file is not None:
            # Textual types it as the TextIOWrapper it found; only write and flush are used.
            self._file = _Tolerant(self._file)  # type: ignore[assignment]

    def run_input_thread(self) -> None:
        try:
            super().run_input_thread()
        except OSError as exc:  # the terminal is gone: no more keys will come
            log.info("terminal input ended: %s", exc)

    def terminal_lost(self) -> None:
        """Stop reading a terminal that hung up: it would read as ready, and empty, for ever."""
        self.disable_input()


class _Tolerant:
    """The terminal's stream for Textual's writer thread: a write that fails is dropped."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
