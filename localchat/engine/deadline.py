"""A time limit for pure-Python work that offers no way to cancel it: a chat template's Jinja
render, which a hostile or broken template can keep in a loop for hours.

``within(seconds, fn)`` runs ``fn`` on the calling thread; if it is still running when the time
is up, the watchdog thread (one for the process) raises ``DeadlineExceeded`` inside it (CPython's asynchronous exception,
checked between bytecodes, so a template looping in Python stops within milliseconds). A single
C call that never returns would not be stopped, but a sandboxed Jinja template cannot make one:
its ranges are capped and what it may call is checked. ``DeadlineExceeded`` is a BaseException
so that no ``except Exception`` on the way (Jinja's own included) mistakes it for the work's
own failure.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(BaseException):
    """Raised inside work that ran past its time limit."""


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``, or ``DeadlineExceeded`` once it has run ``seconds``."""
    key = _WATCHDOG.arm(seconds)
    try:
        return fn()
    finally:
        _WATCHDOG.disarm(key)


class _Watchdog:
    """One daemon thread for every time limit. A turn renders the template once per message
    boundary (engine/layout.py), so starting a timer thread per render would put a thread start
    on the way to every first token; arming this one is a dict entry under a lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[object, list] = {}  # key -> [thread id, due (monotonic), fired]
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> object:
        key = object()
        with self._cond:
            self._armed[key] = [threading.get_ident(), time.monotonic() + seconds, False]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="localchat-deadline",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return key

    def disarm(self, key: object) -> None:
        with self._cond:
            thread_id, _, fired = self._armed.pop(key)
            if fired:
                # Raised already, or still pending: a pending one must not go off later, in
                # code that has nothing to do with the work that was late.
                _raise_in(thread_id, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                waiting = [entry for entry in self._armed.values() if not entry[2]]
                for entry in waiting:
                    if entry[1] <= now:
                        entry[2] = True
                        _raise_in(entry[0], DeadlineExceeded)
                due = [entry[1] for entry in waiting if entry[1] > now]
                self._cond.wait(min(due) - now if due else None)


_WATCHDOG = _Watchdog()


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in thread ``thread_id`` (None: cancel a scheduled one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None)
