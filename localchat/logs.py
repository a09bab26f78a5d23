"""The log file: an unexpected failure keeps its traceback there, and the user sees one line.

``attach()`` points the ``localchat`` loggers at ``paths.log_file()`` through a size-capped
rotating handler (a few MB at most, however long localchat runs), and says where that is so that
the one-line message can name the file. It is called where such a failure is caught (the engine
thread) and when the app opens, for the app's own ``log.exception`` calls; ``localchat doctor``
shows the path. The file is only created when something is logged.
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


def attach() -> Path | None:
    """Send ``localchat.*`` records of level WARNING and up to the log file, once per path (a
    new ``LOCALCHAT_HOME`` moves it); returns that path, or None when it cannot be written."""
    global _handler
    try:
        path = paths.log_file()
    except UserError:  # a read-only home: the one-line message still reaches the user
        return None
    logger = logging.getLogger("localchat")
    with _lock:
        if _handler is not None and _handler.baseFilename == os.path.abspath(path):
            return path
        handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                      encoding="utf-8", delay=True)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler.close()
        logger.addHandler(handler)
        _handler = handler
    return path
