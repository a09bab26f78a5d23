"""Client-side timings of a streamed remote reply, in the same fields as a local turn."""

from __future__ import annotations

import statistics
import time

from localchat.events import Timings
from localchat.percentiles import percentile


class ReplyClock:
    """Records when the turn was submitted and when each piece of reply text arrived.

    A remote server's own timings are not available through the OpenAI protocol, so these are
    measured here and include the network: ``ttft_ms`` is submit → first text, ``tpot_ms`` the
    mean gap between text chunks after the first, ``prompt_ms`` equals ``ttft_ms`` (the server's
    prefill as seen from the client) and ``predicted_ms`` runs from the first to the last chunk.
    ``itl_p50_ms``/``itl_p95_ms`` are percentiles of the same gaps, computed as on the local route
    (which measures the gaps between sampled tokens): servers stream one token per chunk, so both
    routes report the pause between consecutive tokens as the reader receives them.
    """

    def __init__(self) -> None:
        self.submitted = time.perf_counter()
        self.arrivals: list[float] = []
        self.first_answer: float | None = None
        self.thinking_chunks = 0

    def text_arrived(self, *, thinking: bool = False) -> None:
        """A chunk of reply text arrived: reasoning (``thinking``) or answer."""
        now = time.perf_counter()
        self.arrivals.append(now)
        if thinking:
            self.thinking_chunks += 1
        elif self.first_answer is None:
            self.first_answer = now

    def timings(self, *, prompt_n: int | None, predicted_n: int | None, route: str,
                route_reason: str, model: str) -> Timings:
        """Timings so far. ``prompt_n``/``predicted_n`` come from the server's usage chunk when it
        sent one; without it the number of text chunks stands in for the token count."""
        arrivals = self.arrivals
        gaps = [(b - a) * 1000.0 for a, b in zip(arrivals, arrivals[1:], strict=False)]
        ttft = (arrivals[0] - self.submitted) * 1000.0 if arrivals else 0.0
        predicted_ms = (arrivals[-1] - arrivals[0]) * 1000.0 if arrivals else 0.0
        return Timings(
            prompt_n=prompt_n or 0,
            prompt_ms=ttft,
            predicted_n=predicted_n if predicted_n is not None else len(arrivals),
            predicted_ms=predicted_ms,
            ttft_ms=ttft,
            time_to_answer_ms=(self.first_answer - self.submitted) * 1000.0 if self.first_answer else 0.0,
            thinking_n=self.thinking_chunks,
            tpot_ms=statistics.fmean(gaps) if gaps else 0.0,
            itl_p50_ms=percentile(gaps, 50),
            itl_p95_ms=percentile(gaps, 95),
            route=route,
            route_reason=route_reason,
            model=model,
        )

