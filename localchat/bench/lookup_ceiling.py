"""The most prompt lookup could gain on a reply, by hindsight: the bench's ceiling for ``ngram``.

The drafting policy must guess, at each token, how far the lookup's draft will be right. Knowing
the reply, the best schedule of draft lengths is a shortest path: from each position, decode one
token plainly, or check the first k tokens of the lookup's draft there (every k up to the
draft's length) and go on after the accepted ones and the token sampled behind them, at a check
cost of 1 + ``cost(k)`` plain decodes. The reply's tokens per plain decode over that path's cost
is the ceiling: no policy over the same lookups and check costs does better. ``bench
--speculative`` reports it beside the measured ratio, so a miss can be told apart: a policy that
drafts too little, or replies (and check costs) that cannot pay more.

Plain logic over token ids: tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localchat.engine.ngram import MAX_MATCH, lookup


def lookup_ceiling(history: list[int], reply: list[int], cost: Callable[[int], float],
                   is_end: Callable[[int], bool] | None = None, limit: int = MAX_MATCH) -> float:
    """Speed against plain decoding of the best draft schedule over the lookups of ``reply``
    (after ``history``), drafts of at most ``limit`` tokens; 1.0 when nothing can be drafted."""
    n = len(reply)
    if n < 2:
        return 1.0
    tokens = np.array([*history, *reply], dtype=np.int32)
    start = len(history)
    # best[i]: the least cost (in plain decodes) of producing reply[i + 1:] once reply[i] is
    # sampled (the first token comes from the prefill, as in a real turn).
    best = [0.0] * n
    for i in range(n - 2, -1, -1):
        options = [1.0 + best[i + 1]]
        match = lookup(tokens[:start + i + 1], limit, is_end)
        if match is not None:
            accepted = 0
            for k, drafted in enumerate(match.draft, start=1):
                if accepted == k - 1 and i + k < n and reply[i + k] == drafted:
                    accepted = k
                after = min(n - 1, i + accepted + 1)
                options.append(1.0 + cost(k) + best[after])
        best[i] = min(options)
    return (n - 1) / best[0]
