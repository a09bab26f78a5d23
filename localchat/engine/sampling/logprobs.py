"""A sampled token's log probability and the likeliest tokens at its step
(``Sampling.logprobs``: OpenAI's ``logprobs`` and ``top_logprobs``), from the logits it was drawn
from. Only a turn that asks pays for it: one log-sum-exp over the vocabulary per token
(~0.3 ms for 262,144 entries) and a partial sort for the alternatives. The logits are only read,
never changed, so the reply is the one it would be without asking.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localchat.events import TokenLogprob


def token_logprob(logits: np.ndarray, token: int, top: int,
                  piece: Callable[[int], bytes]) -> TokenLogprob:
    """``token``'s TokenLogprob under ``logits``, with the ``top`` likeliest tokens (``piece``:
    a token's bytes)."""
    best = float(logits.max())
    log_total = best + float(np.log(np.exp(logits - np.float32(best), dtype=np.float64).sum()))
    alternatives: tuple[tuple[bytes, float], ...] = ()
    if top > 0:
        count = min(top, len(logits))
        ids = np.argpartition(logits, len(logits) - count)[len(logits) - count:]
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        alternatives = tuple((piece(int(i)), float(logits[i]) - log_total) for i in ids)
    return TokenLogprob(piece(token), float(logits[token]) - log_total, alternatives)
