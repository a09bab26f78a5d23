"""Leaving the app: the process ends when the app does, even if a worker thread is stuck.

Textual runs thread workers (model loading, replies) in asyncio's default executor, and
``asyncio.run`` waits on the way out for every thread of it, with no time limit: a worker stuck
in code that cannot be interrupted (a C call into llama.cpp that does not return, a chat
template looping before renders had a time limit) kept the process alive at full CPU, with a
blank screen, after Ctrl+Q; more Ctrl+C only printed a traceback. ``run_until_quit`` runs the
app on a loop of its own, gives workers a grace period to finish what they were doing (the app
has already stored the reply and waited for its snapshot by then: see ``on_unmount``), and ends
the process without those that are still stuck. While the app runs, SIGTERM and SIGHUP reach it
on its loop (``localchat.ending``), so a closed terminal or a ``kill`` quits it as Ctrl+Q does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from localchat.ending import ENDING_SIGNALS, handled

if TYPE_CHECKING:
    from textual.app import App

log = logging.getLogger(__name__)

GRACE_S = 5.0  # longer than any finishing step takes (a bounded template render included)
_WORKER_PREFIX = "localchat-worker"


def run_until_quit(app: App, on_signal: Callable[[int], None] | None = None) -> tuple[int, bool]:
    """Run ``app`` until it exits; (its exit status, whether a worker is still stuck after the
    grace period, in which case the caller must end the process with ``exit_now``).

    ``on_signal(signum)`` is called on the app's loop for SIGTERM, SIGHUP and SIGINT (those not
    ignored at start) until the app has exited: see ``localchat.ending``."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix=_WORKER_PREFIX))
    signals = handled((*ENDING_SIGNALS, signal.SIGINT)) if on_signal is not None else []
    if sys.platform == "win32":  # no signal handlers on a Windows event loop
        signals = []
    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)  # type: ignore[arg-type]
    try:
        app.run(loop=loop)
        # Textual sets 1 when the app ended on an error (one at start, or no terminal to run in);
        # run()'s own result would be None then, which read as success.
        code = app.return_code or 0
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        loop.close()  # shuts the executor down without waiting for its threads
    return code, not _workers_finish(GRACE_S)


def _workers_finish(seconds: float) -> bool:
    """Wait up to ``seconds`` for the app's worker threads; True if none is left."""
    deadline = time.monotonic() + seconds
    try:
        for thread in threading.enumerate():
            if thread.name.startswith(_WORKER_PREFIX):
                thread.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:  # Ctrl+C while waiting: stop waiting
        pass
    stuck = [t.name for t in threading.enumerate() if t.name.startswith(_WORKER_PREFIX) and t.is_alive()]
    if stuck:
        log.warning("quitting with worker threads still running: %s", ", ".join(stuck))
    return not stuck


def exit_now(code: int) -> None:
    """End the process at once, without joining threads that will never finish (the executor's
    exit hook would wait for them for ever)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
