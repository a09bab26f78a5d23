"""A circuit breaker for the remote: stop sending automatic escalations to a server that keeps
failing, then try again after a cool-down.

States: *closed* (requests allowed), *open* (marked down until ``down_until``), and *half-open*
(the cool-down has passed; the next request is the probe — its success closes the breaker, its
failure opens it for another cool-down). Only whole turns count: a retried request that finally
succeeds is a success, a turn the user stopped is neither.

The state can be kept in a small JSON file (``cache_dir()/remote_breaker.json``) so that a burst of
``localchat ask`` processes does not hammer a dead server either. The file holds the base URL
(without any user:password part), the failure count and a wall-clock time — never a key.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from localchat.atomic import write_text_atomic

BreakerState = Literal["closed", "open", "half-open"]


@dataclass(frozen=True)
class BreakerStatus:
    state: BreakerState
    consecutive_failures: int
    retry_in_s: float  # seconds until the next probe is allowed; 0 unless open


class CircuitBreaker:
    """Counts consecutive failed turns; after ``failure_threshold`` of them the remote is down for
    ``cooldown_s`` seconds. Thread-safe. ``clock`` is wall-clock seconds (persisted state must
    survive a process restart, which a monotonic clock does not)."""

    def __init__(
        self,
        failure_threshold: int = 3,
        cooldown_s: float = 120.0,
        *,
        state_file: Path | None = None,
        base_url: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._state_file = state_file
        self._server = _without_credentials(base_url)
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._down_until = 0.0
        self._load()

    def allows_request(self) -> bool:
        """True when closed or half-open (the cool-down is over and a probe may go out)."""
        return self.status().state != "open"

    def status(self) -> BreakerStatus:
        with self._lock:
            self._load()
            if self._failures < self.failure_threshold:
                return BreakerStatus("closed", self._failures, 0.0)
            remaining = self._down_until - self._clock()
            if remaining > 0:
                return BreakerStatus("open", self._failures, remaining)
            return BreakerStatus("half-open", self._failures, 0.0)

    def record_success(self) -> None:
        with self._lock:
            self._failures, self._down_until = 0, 0.0
            self._save()

    def record_failure(self) -> None:
        """Count a failed turn; reaching the threshold (or failing a half-open probe) opens it."""
        with self._lock:
            self._load()
            self._failures += 1
            if self._failures >= self.failure_threshold:
                self._down_until = self._clock() + self.cooldown_s
            self._save()

    def describe(self) -> str:
        """One line for a notice, e.g. "remote marked down after 3 failed turns; retry in 95 s"."""
        s = self.status()
        if s.state == "open":
            return (f"remote marked down after {s.consecutive_failures} failed turns; "
                    f"next try in {max(1, round(s.retry_in_s))} s")
        if s.state == "half-open":
            return "remote was down; the next turn will probe it"
        return "remote is up" if s.consecutive_failures == 0 else (
            f"remote failed {s.consecutive_failures} turn(s) in a row")

    def __repr__(self) -> str:
        s = self.status()
        return f"<CircuitBreaker {s.state} failures={s.consecutive_failures}/{self.failure_threshold}>"

    # -- persistence ---------------------------------------------------------------------------

    def _load(self) -> None:
        # Re-read on every check so that separate processes share what they learned.
        if self._state_file is None:
            return
        try:
            data = json.loads(self._state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # no file yet, or a damaged one: start from what is in memory
        if not isinstance(data, dict) or data.get("server") != self._server:
            return
        failures, down_until = data.get("consecutive_failures"), data.get("down_until")
        if isinstance(failures, int) and isinstance(down_until, (int, float)):
            self._failures, self._down_until = failures, float(down_until)

    def _save(self) -> None:
        if self._state_file is None:
            return
        data = {"server": self._server, "consecutive_failures": self._failures,
                "down_until": self._down_until}
        try:
            write_text_atomic(self._state_file, json.dumps(data) + "\n")
        except OSError:
            pass  # the breaker still works in memory; a read-only cache dir is not an error


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # settings refuse such a URL; a breaker must never be what fails on it
        port = None
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
