"""A fresh turn's next-token logits, for the exactness oracle (``Engine.fresh_logits``): where a
cached reply and a fresh one differ, these tell a near-tie flipped by batch-shape rounding from a
clear preference (a wrong cell)."""

from __future__ import annotations

import numpy as np

from localchat.engine.image_records import image_run, next_image
from localchat.engine.kv import ConversationCache


def fresh_logits(kv: ConversationCache, prompt: list[int], reply: list[int],
                 check_size: int | None, chunk: int) -> np.ndarray:
    """The logits after ``prompt`` and ``reply`` prefilled on an empty cache (emptied again
    afterwards), on a fresh turn's schedule: the prompt in batches of ``chunk``, the reply one
    token at a time, or with ``check_size`` in batches of that many tokens with logits at each,
    as speculative checks evaluate drafts."""
    runtime = kv.runtime
    kv.forget()
    try:
        # Not abortable: no turn is running that a stop could be meant for.
        i = 0
        while i < len(prompt):
            image = image_run(prompt, i)
            if image:  # a picture in the prompt: evaluated as a turn's prefill evaluates it
                kv.evaluate_image(prompt[i], image, i)
                i += image
                continue
            end = min(i + chunk, next_image(prompt, i))
            runtime.decode(prompt[i:end], i)
            i = end
        if check_size is None or not reply:
            for j, token in enumerate(reply):
                runtime.decode([token], len(prompt) + j)
            return np.array(runtime.last_logits())
        for j in range(0, len(reply), check_size):
            # One token more after the last batch (a draft), so even one reply token is
            # checked in a batch; the logits wanted are those before it.
            batch = reply[j:j + check_size]
            if j + check_size >= len(reply):
                batch = [*batch, reply[-1]]
            runtime.decode(batch, len(prompt) + j, outputs=len(batch))
        return np.array(runtime.logits_at(len(batch) - 2))
    finally:
        kv.forget()
