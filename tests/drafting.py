"""What the speculative-decoding tests share: an edit that prompt lookup drafts long runs of,
their greedy sampling, and one reply answered with a given speculation mode."""

from __future__ import annotations

from oracle import reply_tokens

from localchat.engine.options import Sampling
from localchat.events import Done

# An edit that copies: prompt lookup drafts long runs of it.
EDIT = [{"role": "user", "content":
         "Fix the spelling mistakes in this text and write it out again in full:\n\nThe quick "
         "brown fox jumpd over the lazy dog. The dog was not amused and barkd loudly at the fox, "
         "who ran away into the forrest."}]
GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=48)


def answer(engine, mode: str, messages: list[dict[str, str]],
           sampling: Sampling = GREEDY) -> tuple[list[int], Done]:
    """``messages`` answered on an empty cache with speculation ``mode``."""
    engine.set_speculative(mode)
    engine.reset()
    return reply_tokens(engine.submit(messages, sampling))
