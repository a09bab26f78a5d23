"""ThreadGovernor: keep decoding at the hardware's real speed when other programs compete for
the CPU.

ggml's threads meet at a spinning barrier for every graph node. When another process takes a
core, a descheduled thread makes the others spin away their time slices: on a 2-core laptop CPU
two threads decode a token of a 135M model in ~12 ms when idle but ~3 s while a compiler runs,
where one thread stays near 20-40 ms. The governor decodes a couple of tokens now and then with the other thread
count and keeps whichever is faster. Each try that loses doubles the wait before the next one
(up to MAX_PROBE_EVERY tokens), so on a quiet machine the tries cost well under 1% of decode
time, and a long contention costs a slow token rarely.
"""

from __future__ import annotations

from collections.abc import Callable

FIRST_PROBE = 2  # tokens before the first comparison
PROBE_EVERY = 64  # tokens between comparisons
MAX_PROBE_EVERY = 1024
PROBE_TOKENS = 2  # tokens decoded with the other thread count per comparison (the first warms up)
BETTER = 0.85  # the other count must be at least this much faster to switch


class ThreadGovernor:
    def __init__(self, max_threads: int, apply: Callable[[int], None]) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self._apply = apply
        self._home_ms: float | None = None  # recent per-token time with the chosen count
        self._probe: list[float] | None = None  # times measured while trying the other count
        self._home = max_threads
        self._count = 0
        self._interval = PROBE_EVERY
        self._next_probe = FIRST_PROBE

    def observe(self, ms_per_token: float) -> None:
        """Report the time one decoded token took with the current thread count."""
        if self.max_threads <= 1:
            return
        self._count += 1
        if self._probe is not None:
            self._probe.append(ms_per_token)
            if len(self._probe) >= PROBE_TOKENS:
                self._decide(min(self._probe))
            return
        self._home_ms = ms_per_token if self._home_ms is None else 0.7 * self._home_ms + 0.3 * ms_per_token
        if self._count >= self._next_probe:
            self._home = self.threads
            self._probe = []
            self._switch(1 if self.threads == self.max_threads else self.max_threads)

    def _decide(self, probe_ms: float) -> None:
        home_ms = self._home_ms or probe_ms
        self._probe = None
        if probe_ms < BETTER * home_ms:
            self._home_ms = probe_ms  # keep the other count
            self._interval = PROBE_EVERY
        else:
            self._interval = min(2 * self._interval, MAX_PROBE_EVERY)
            self._switch(self._home)
        self._next_probe = self._count + self._interval

    def _switch(self, threads: int) -> None:
        if threads != self.threads:
            self.threads = threads
            self._apply(threads)
