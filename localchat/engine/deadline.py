"""A time limit for pure-Python work that offers no way to cancel it: a chat template's Jinja
render, which a hostile or broken template can keep in a loop for hours.

``within(seconds, fn)`` runs ``fn`` on the calling thread; if it is still running when the time
is up, a watchdog thread raises ``DeadlineExceeded`` inside it (CPython's asynchronous exception,
checked between bytecodes, so a template looping in Python stops within milliseconds). A single
C call that never returns would not be stopped, but a sandboxed Jinja template cannot make one:
its ranges are capped and what it may call is checked. ``DeadlineExceeded`` is a BaseException
so that no ``except Exception`` on the way (Jinja's own included) mistakes it for the work's
own failure.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(BaseException):
    """Raised inside work that ran past its time limit."""


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``, or ``DeadlineExceeded`` once it has run ``seconds``."""
    target = threading.get_ident()
    lock = threading.Lock()
    running, fired = [True], [False]

    def expire() -> None:
        with lock:
            if running[0]:
                fired[0] = True
                _raise_in(target, DeadlineExceeded)

    watchdog = threading.Timer(seconds, expire)
    watchdog.name, watchdog.daemon = "localchat-deadline", True
    watchdog.start()
    try:
        return fn()
    finally:
        watchdog.cancel()
        with lock:
            running[0] = False
            if fired[0]:
                # Raised already, or still pending: a pending one must not go off later, in
                # code that has nothing to do with the work that was late.
                _raise_in(target, None)


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in thread ``thread_id`` (None: cancel a scheduled one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None)
