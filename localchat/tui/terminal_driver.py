"""The app's terminal driver: Textual's own, made to outlive the terminal it draws on.

When the terminal's window is closed, writing to it fails (EIO) and reading it fails or returns
nothing. Textual's writer thread dies on the first failed write, after which its bounded queue
fills and the next frame blocks the UI thread for ever; its input thread turns a failed read into
a crash screen. Either stops the app before it can save the reply it was writing. Here a failed
write is dropped and a failed read ends the input, and either tells the app that its terminal
hung up, as the SIGHUP that normally follows does (``localchat.ending``): so the app quits as
Ctrl+Q does even when SIGHUP is ignored (``nohup``), instead of running on with no terminal.
"""

from __future__ import annotations

import errno
import logging
import signal
from typing import IO, Any

from textual.drivers.linux_driver import LinuxDriver

log = logging.getLogger(__name__)

# What writing to or reading from a terminal that hung up fails with.
_HUNG_UP = {errno.EIO, errno.ENXIO}


class TerminalDriver(LinuxDriver):
    """``LinuxDriver`` whose output and input survive a terminal that went away."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._file is not None:
            # Textual types it as the TextIOWrapper it found; only write and flush are used.
            self._file = _Tolerant(self._file, self._hung_up)  # type: ignore[assignment]

    def run_input_thread(self) -> None:
        try:
            super().run_input_thread()
        except OSError as exc:  # no more keys will come
            log.info("terminal input ended: %s", exc)
            if exc.errno in _HUNG_UP:
                self._hung_up()

    def stop_reading(self) -> None:
        """Stop reading a terminal that hung up: it would read as ready, and empty, for ever."""
        self.disable_input()

    def _hung_up(self) -> None:
        """From the writer or input thread: the app hears it as SIGHUP, on its own loop."""
        end_on_signal = getattr(self._app, "end_on_signal", None)
        if end_on_signal is not None:
            self._loop.call_soon_threadsafe(end_on_signal, signal.SIGHUP)


class _Tolerant:
    """The terminal's stream for Textual's writer thread: a write that fails is dropped, and
    the first that fails because the terminal hung up calls ``on_hang_up``."""

    def __init__(self, stream: IO[str], on_hang_up: Any) -> None:
        self._stream = stream
        self._on_hang_up = on_hang_up
        self._hung_up = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if not self._hung_up and getattr(exc, "errno", None) in _HUNG_UP:
            self._hung_up = True
            self._on_hang_up()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
