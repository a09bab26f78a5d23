"""OpenAI's ``logprobs`` and ``top_logprobs`` on a chat request, and the ``logprobs`` object of
its answer: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}, ...]}, ...]}``, one entry per answer token (``events.TokenLogprob``), in the whole
answer and, for the tokens each carries, in each streamed chunk.

``logprobs`` is true or false as OpenAI has it, or (as llama-server and the older completions
API take it) the number of alternatives; ``top_logprobs`` is at most 20, OpenAI's limit. The
probabilities are those of the logits each token was drawn from (after the repeat penalty,
before temperature and the truncations), as llama-server reports by default.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from localchat.events import TokenLogprob
from localchat.serve.fields import integer, shown
from localchat.serve.http_errors import bad

MAX_TOP_LOGPROBS = 20


def logprobs_of(body: dict[str, Any]) -> int | None:
    """How many alternatives each answer token comes with (0: its own log probability only;
    None: none asked); BadRequest naming the field."""
    top = integer(body, "top_logprobs", 0, high=MAX_TOP_LOGPROBS)
    value = body.get("logprobs")
    if value is None or value is False:
        if top:
            raise bad("top_logprobs", "needs \"logprobs\": true")
        return None
    if value is True:
        return top or 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOP_LOGPROBS:
        return top if top is not None else value
    raise bad("logprobs", f"must be true, false or a number of alternatives from 0 to "
                          f"{MAX_TOP_LOGPROBS}, not {shown(value)}")


def logprobs_body(logprobs: Iterable[TokenLogprob]) -> dict[str, Any]:
    """The ``logprobs`` object of a choice (or of a chunk's choice) for these tokens."""
    return {"content": [{**_entry(lp.token, lp.logprob),
                         "top_logprobs": [_entry(token, logprob) for token, logprob in lp.top]}
                        for lp in logprobs], "refusal": None}


def _entry(token: bytes, logprob: float) -> dict[str, Any]:
    # A token may hold part of a character: its text shows U+FFFD, its bytes are exact.
    return {"token": token.decode("utf-8", errors="replace"), "logprob": logprob,
            "bytes": list(token)}
