"""Regular expressions from a schema, run with a bound.

A JSON Schema's ``pattern`` (and ``patternProperties``) comes from a user (``--schema``), a
request (``response_format``) or a tool server, and the text it is matched against from a
model. Python's ``re`` backtracks: ``^(a+)+$`` against 36 a's and a ``!`` runs for hours inside
one C call that holds the GIL, so that neither SIGINT nor SIGTERM is heard. Every pattern that
jsonschema runs goes through :func:`search` instead, on the ``regex`` engine with a timeout:

- one search gives up after ``SEARCH_S``; all of one check (:func:`budget`) after ``CHECK_S``;
- a search that gave up counts as no match (the value is reported as not matching, never as
  valid), and the check's :class:`Budget` says that it happened, so that the message can say
  the pattern was too slow rather than that the text is wrong.

jsonschema has no setting for its regular expression engine: :func:`install_in_jsonschema`
points the ``re`` its keyword modules call at this one (they call only ``re.search``).
"""

from __future__ import annotations

import contextvars
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import regex

SEARCH_S = 0.1
CHECK_S = 1.0


@dataclass
class Budget:
    """One check's time for its patterns: until ``deadline`` (time.monotonic)."""

    deadline: float
    gave_up: str | None = None  # the first pattern that ran out of time

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("pattern_budget", default=None)


@contextmanager
def budget(seconds: float = CHECK_S) -> Iterator[Budget]:
    """The patterns run inside share ``seconds`` in all."""
    current = Budget(time.monotonic() + seconds)
    token = _budget.set(current)
    try:
        yield current
    finally:
        _budget.reset(token)


def search(pattern: str, string: str, flags: int = 0) -> Any:
    """``re.search`` with the bound (see the module): a match, or None."""
    current = _budget.get()
    seconds = SEARCH_S if current is None else min(SEARCH_S, current.remaining())
    try:
        if seconds <= 0:
            raise TimeoutError
        return regex.search(pattern, string, flags, timeout=seconds)
    except TimeoutError:
        if current is not None and current.gave_up is None:
            current.gave_up = pattern
        return None


_installed = False


def install_in_jsonschema() -> None:
    """Make jsonschema's keywords search with :func:`search` (once; idempotent)."""
    global _installed
    if _installed:
        return
    from jsonschema import _keywords, _legacy_keywords, _utils

    bounded = types.SimpleNamespace(search=search)
    for module in (_keywords, _legacy_keywords, _utils):
        module.re = bounded
    _installed = True
