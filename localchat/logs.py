"""The log file: an unexpected failure keeps its traceback there, and the user sees one line.

``attach()`` points the ``localchat`` loggers at ``paths.log_file()`` through a size-capped
rotating handler (a few MB at most, however long localchat runs), and says where that is so that
the one-line message can name the file. It is called where such a failure is caught (the engine
thread) and when the app opens, for the app's own ``log.exception`` calls; ``localchat doctor``
shows the path. The file is only created when something is logged.

:func:`route` sends other libraries' loggers to the same file (the MCP SDK logs a server's bad
output with tracebacks, which must never reach the screen), and :func:`server_log` is the logger
a tool server's stderr is written to, one INFO record per line: the only INFO records the file
takes (every other localchat logger stays at WARNING).
"""

from __future__ import annotations

import logging
import os
import threading
from logging.handlers import RotatingFileHandler
from pathlib import Path

from localchat import paths
from localchat.errors import UserError

MAX_BYTES = 1_000_000
BACKUPS = 2  # localchat.log.1 and .2: three files of MAX_BYTES at most

_lock = threading.Lock()
_handler: RotatingFileHandler | None = None
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
        if _handler is not None and _handler.baseFilename == os.path.abspath(path):
            return path
        handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                      encoding="utf-8", delay=True)
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


def route(*names: str) -> None:
    """Send the loggers ``names`` (and their children) to the log file too, not to the screen:
    a logger with no handler of its own ends up on stderr through logging's last resort."""
    attach()
    with _lock:
        for name in names:
            if name not in _routed:
                _routed.add(name)
                logger = logging.getLogger(name)
                logger.addHandler(logging.NullHandler())  # no file (a read-only home): silence
                if _handler is not None:
                    logger.addHandler(_handler)
                logger.propagate = False  # the file is where they go, and only there


def server_log(server: str) -> logging.Logger:
    """The logger of one tool server's stderr lines (INFO, under ``localchat.tools.server``)."""
    attach()
    logging.getLogger(SERVER_LOGGER).setLevel(logging.INFO)
    return logging.getLogger(f"{SERVER_LOGGER}.{server}")
