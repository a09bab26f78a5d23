"""ThreadGovernor: keep decoding at the hardware's real speed when other programs compete for
the CPU.

ggml's threads meet at a spinning barrier for every graph node. When another process takes a
core, a descheduled thread makes the others spin away their time slices: on a 2-core laptop CPU
two threads decode a token of a 135M model in ~12 ms when idle but ~3 s while a compiler runs,
where one thread stays near 20-40 ms. The governor then decodes a couple of tokens with fewer
threads and keeps whichever count is faster.

A try is not free: its tokens take ~1.7x as long on an idle machine. So with every thread it
tries once at the start, then only when decoding slows down (two tokens in a row 1.5x slower
than the recent best: a competitor, not a one-off hiccup) or after MAX_PROBE_EVERY tokens
without a try; an idle machine pays two slow tokens per 1,024. With fewer threads it tries all of
them again after PROBE_EVERY tokens, since nothing there tells that the competitor has left. Each
such try that loses doubles the wait before the next one (up to MAX_PROBE_EVERY tokens).

A try that wins by less than 4x is played again before it counts: the count it left is measured
anew for PROBE_TOKENS tokens, and the other count is kept only if it still beats that. In the app
the first tokens of a reply wait on the UI's layout (16-25 ms against ~7.5 ms later, the test
model on 2 cores), so the first try at token 2 "won" with one thread at 11-12 ms and a third of
the replies decoded 64 tokens on one thread (decode 0.73-0.78 of the engine alone in those
rounds, against 1.08 in the others). With a rematch below 2x wins only, one app reply in four
still did (tmux: 22.3 ms for the first two tokens against 9-11 ms on one thread). A competitor
wins by far more than 4x (3 s against 40 ms), and is trusted at once.
"""

from __future__ import annotations

from collections.abc import Callable

FIRST_PROBE = 2  # tokens before the first comparison
PROBE_EVERY = 64  # tokens between comparisons
MAX_PROBE_EVERY = 1024
PROBE_TOKENS = 2  # tokens decoded with the other thread count per comparison (the first warms up)
BETTER = 0.85  # the other count must be at least this much faster to switch
CLEAR = 0.25  # a win by less than this is checked against the left count measured again
SLOW = 1.5  # a token this much slower than the recent best (all threads) hints at a competitor
SLOW_STREAK = 2  # slow tokens in a row that make a try due
# The recent best may rise this much per token: a deeper context decodes a little slower.
BEST_CREEP = 1.01


class ThreadGovernor:
    def __init__(self, max_threads: int, apply: Callable[[int], None]) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self._apply = apply
        self._home_ms: float | None = None  # recent per-token time with the chosen count
        self._best_ms = float("inf")  # recent best per-token time with every thread
        self._slow = 0  # slow tokens in a row, with every thread
        self._probe: list[float] | None = None  # times measured while trying the other count
        self._home = max_threads
        self._count = 0
        self._interval = PROBE_EVERY
        self._next_probe = FIRST_PROBE
        self._last_probe: int | None = None  # token count at the last decision
        self._evidence = False  # whether the try under way was made because decoding slowed
        self._rematch: float | None = None  # the other count's time while its close win is checked

    def observe(self, ms_per_token: float) -> None:
        """Report the time one decoded token took with the current thread count."""
        if self.max_threads <= 1:
            return
        self._count += 1
        if self._probe is not None:
            self._probe.append(ms_per_token)
            if len(self._probe) >= PROBE_TOKENS:
                if self._rematch is None:
                    self._decide(min(self._probe))
                else:
                    self._decide_rematch(min(self._probe))
            return
        home = self._home_ms
        self._home_ms = ms_per_token if home is None else 0.7 * home + 0.3 * ms_per_token
        if self.threads == self.max_threads:
            best = self._best_ms
            self._slow = self._slow + 1 if ms_per_token > SLOW * best else 0
            best *= BEST_CREEP
            self._best_ms = ms_per_token if ms_per_token < best else best
        if self._count >= self._next_probe and self._try_due():
            self._home = self.threads
            self._probe = []
            # A try made on evidence (slow tokens, or fewer threads than cores) that loses
            # backs off; the first try and the long-interval one do not delay the next.
            self._evidence = self.threads != self.max_threads or self._slow >= SLOW_STREAK
            self._switch(self._other())

    def _try_due(self) -> bool:
        """Whether to try the other count now that the wait after the last try is over."""
        if self.threads != self.max_threads or self._last_probe is None:
            return True
        return self._slow >= SLOW_STREAK or self._count - self._last_probe >= MAX_PROBE_EVERY

    def _decide(self, probe_ms: float) -> None:
        home_ms = self._home_ms or probe_ms
        if CLEAR * home_ms <= probe_ms < BETTER * home_ms:
            # A close win: measure the left count again before believing it.
            self._rematch = probe_ms
            self._probe = []
            self._switch(self._home)
            return
        self._end_try()
        if probe_ms < BETTER * home_ms:
            self._keep_other(probe_ms)
        else:
            self._stay_home(home_ms)

    def _decide_rematch(self, home_ms: float) -> None:
        other_ms = self._rematch or home_ms
        self._rematch = None
        self._end_try()
        if other_ms < BETTER * home_ms:
            self._switch(self._other())
            self._keep_other(other_ms)
        else:
            self._stay_home(home_ms)

    def _end_try(self) -> None:
        self._probe = None
        self._slow = 0
        self._last_probe = self._count

    def _keep_other(self, other_ms: float) -> None:
        self._home_ms = other_ms
        self._interval = PROBE_EVERY
        self._next_probe = self._count + self._interval

    def _stay_home(self, home_ms: float) -> None:
        self._home_ms = home_ms
        self._switch(self._home)
        if self._evidence:
            self._interval = min(2 * self._interval, MAX_PROBE_EVERY)
            self._next_probe = self._count + self._interval

    def _other(self) -> int:
        return 1 if self._home == self.max_threads else self.max_threads

    def _switch(self, threads: int) -> None:
        if threads != self.threads:
            self.threads = threads
            self._apply(threads)
