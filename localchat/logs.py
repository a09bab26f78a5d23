"""The log file: an unexpected failure keeps its traceback there, and the user sees one line.

``attach()`` points the ``localchat`` loggers at ``paths.log_file()`` through a size-capped
handler (a few MB at most, however long localchat runs), and says where that is so that the
one-line message can name the file. It is called where such a failure is caught (the engine
thread, the remote client's) and when the app opens, for the app's own ``log.exception`` calls;
``localchat doctor`` shows the path. The file is only created when something is logged.

Several localchat processes write the one file at once (the app, an ``ask``, a bench): each
record is appended, and the file rotated when full, under an inter-process lock, so that no
rotation races another (logging's own RotatingFileHandler did, and printed "--- Logging error
---" with a traceback in a third of such rounds). A record that cannot be written is dropped:
a log never prints to the user's terminal, nor stops what was logging.

:func:`route` sends other libraries' loggers to the same file (the MCP SDK logs a server's bad
output with tracebacks, which must never reach the screen), and :func:`server_log` is the logger
a tool server's stderr is written to, one INFO record per line: the only INFO records the file
takes (every other localchat logger stays at WARNING).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from localchat import paths
from localchat.errors import UserError

MAX_BYTES = 1_000_000
# One record at most this long: a 20 MB line on a tool server's stderr made a 20 MB log file (a
# record is written whole, past the cap). A longer one keeps its head and its tail (a traceback's
# last line says what went wrong), with how much was cut between them.
MAX_RECORD_BYTES = 16_384
BACKUPS = 2  # localchat.log.1 and .2: three files of MAX_BYTES at most
LOCK_WAIT_S = 2.0  # past this, the record is written without rotating rather than lost

_lock = threading.Lock()
_handler: SharedLogFile | None = None
_routed: set[str] = set()  # other loggers sent to the same file
SERVER_LOGGER = "localchat.tools.server"


def attach() -> Path | None:
    """Send ``localchat.*`` records of level WARNING and up to the log file, once per path (a
    new ``LOCALCHAT_HOME`` moves it); returns that path, or None when it cannot be written."""
    global _handler
    try:
        path = paths.log_file()
    except UserError:  # a read-only home: the one-line message still reaches the user
        return None
    with _lock:
        if _handler is not None and _handler.path == path:
            return path
        handler = SharedLogFile(path, MAX_BYTES, BACKUPS)
        # INFO passes only for loggers set to it (server_log's); the rest stay at WARNING.
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
        for name in ("localchat", *_routed):
            if _handler is not None:
                logging.getLogger(name).removeHandler(_handler)
            logging.getLogger(name).addHandler(handler)
        if _handler is not None:
            _handler.close()
        _handler = handler
    return path


class SharedLogFile(logging.Handler):
    """Appends records to ``path``, which other processes may be writing too, and rotates it to
    ``path.1`` … ``path.N`` before a record would take it past ``max_bytes``: both under a lock
    on ``.NAME.lock`` beside it, and rotating only when the file on disk is full (not when this
    process last saw it so: another may have rotated it since)."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        super().__init__()
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        from filelock import FileLock

        # Hidden: beside the log, not one of its files (``localchat.log*``).
        self._file_lock = FileLock(path.with_name(f".{path.name}.lock"), timeout=LOCK_WAIT_S)

    def emit(self, record: logging.LogRecord) -> None:
        from filelock import Timeout

        try:
            data = cut_record(self.format(record).encode("utf-8", errors="replace")) + b"\n"
            try:
                with self._file_lock:
                    self._rotate_for(len(data))
                    self._append(data)
            except Timeout:  # a writer stuck holding the lock: keep the record, unrotated
                self._append(data)
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        """Drop the record: logging's default prints a traceback on stderr, the user's screen."""

    def _append(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)

    def _rotate_for(self, incoming: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if not size or size + incoming <= self.max_bytes:
            return
        for n in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n}"))

    def __repr__(self) -> str:
        return f"<SharedLogFile {self.path} max {self.max_bytes} bytes, {self.backups} backups>"


def cut_record(data: bytes, limit: int | None = None) -> bytes:
    """``data`` if it is at most ``limit`` bytes (MAX_RECORD_BYTES), else its head and tail with
    the number of bytes cut between them."""
    limit = MAX_RECORD_BYTES if limit is None else limit
    if len(data) <= limit:
        return data
    half = limit // 2
    cut = len(data) - 2 * half
    return data[:half] + f" [… {cut:,} bytes cut …] ".encode() + data[-half:]


def route(*names: str) -> None:
    """Send the loggers ``names`` (and their children) to the log file, not to the screen: a
    logger with no handler of its own ends up on stderr through logging's last resort, and a
    library may give its logger a handler on stderr itself (huggingface_hub does, at import:
    its download warnings drew over the app's screen; and one made while a test captured stderr
    writes to that capture after it is closed, a "--- Logging error ---" later on)."""
    attach()
    with _lock:
        for name in names:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler:  # a terminal's, not a file's
                    logger.removeHandler(handler)
            if name not in _routed:
                _routed.add(name)
                logger.addHandler(logging.NullHandler())  # no file (a read-only home): silence
                if _handler is not None:
                    logger.addHandler(_handler)
                logger.propagate = False  # the file is where they go, and only there


def server_log(server: str) -> logging.Logger:
    """The logger of one tool server's stderr lines (INFO, under ``localchat.tools.server``)."""
    attach()
    logging.getLogger(SERVER_LOGGER).setLevel(logging.INFO)
    return logging.getLogger(f"{SERVER_LOGGER}.{server}")
