"""Prompt-lookup drafts: the tokens that followed the most recent earlier occurrence of what the
reply just wrote, looked up in the conversation's exact token record (the cached history and the
reply so far). Edits, corrections and rewrites copy long runs of earlier text; where the reply
writes something new nothing matches, and nothing is drafted.

The lookup is a few vectorised passes over the record (numpy), so it costs microseconds per
token even on a full context: the positions holding the reply's last token, narrowed one token
further back at a time while any candidate still agrees. The survivors share the longest match
(capped at ``MAX_MATCH``), so longer keys win over shorter ones, and among them the most recent
occurrence wins (llama-cpp-python's ``LlamaPromptLookupDecoding`` takes the earliest, and a fixed
key length). How far the match reaches back is returned with the draft: the drafting policy
(``speculate``) learns how often each such length is right.

Plain logic over token ids: tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# A one-token key matches nearly everywhere in prose and predicts little; two tokens is the least.
MIN_MATCH = 2
# How far back a match is followed. Longer matches than this say nothing more about the draft.
MAX_MATCH = 16


class TokenLog:
    """The tokens the reply continues, in order: the cached conversation, then each sampled
    token as it is appended. Kept in one numpy array grown in place."""

    def __init__(self, tokens: list[int]) -> None:
        # 64-bit: a picture's placeholder ids are negative 64-bit numbers (``image_records``).
        self._array = np.zeros(max(64, 2 * len(tokens)), dtype=np.int64)
        self._array[:len(tokens)] = tokens
        self.n = len(tokens)
        self.history_n = len(tokens)  # the conversation before the reply; the reply follows

    def append(self, token: int) -> None:
        if self.n == len(self._array):
            self._array = np.concatenate([self._array, np.zeros_like(self._array)])
        self._array[self.n] = token
        self.n += 1

    @property
    def tokens(self) -> np.ndarray:
        """A view of the tokens so far (valid until the next ``append``)."""
        return self._array[:self.n]

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True)
class Match:
    """Where the reply's last tokens occurred before, and what followed them there."""

    draft: list[int]
    length: int  # how many tokens before the draft agree (MIN_MATCH..MAX_MATCH)
    start: int = 0  # where in the tokens the draft was copied from


def lookup(tokens: np.ndarray, limit: int, is_end: Callable[[int], bool] | None = None) -> Match | None:
    """The continuation (at most ``limit`` tokens) of the most recent earlier occurrence of the
    longest suffix of ``tokens`` that occurred before, or None when no suffix of ``MIN_MATCH``
    tokens did. The draft stops before an end-of-generation token (``is_end``): sampling one ends
    the reply, and its cell is never needed; and before a picture's placeholders."""
    n = len(tokens)
    if n < MIN_MATCH + 1 or limit <= 0:
        return None
    candidates = np.flatnonzero(tokens[:n - 1] == tokens[n - 1])
    length = 1
    while candidates.size and length < MAX_MATCH:
        earlier = candidates - length
        keep = earlier >= 0
        narrowed = candidates[keep][tokens[earlier[keep]] == tokens[n - 1 - length]]
        if not narrowed.size:
            break
        candidates, length = narrowed, length + 1
    if length < MIN_MATCH or not candidates.size:
        return None
    start = int(candidates[-1]) + 1  # flatnonzero is ascending: the last is the most recent
    draft = tokens[start:min(start + limit, n)].tolist()
    for i, token in enumerate(draft):
        # A picture's placeholder cells (negative ids, ``image_records``) are never drafted:
        # the model writes no picture, and the ids are no tokens of its vocabulary.
        if token < 0 or (is_end is not None and is_end(token)):
            draft = draft[:i]
            break
    return Match(draft, length, start) if draft else None
