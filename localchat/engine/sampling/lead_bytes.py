"""Which tokens a grammar may allow next, narrowed without asking it about each one: a table of
every token's first two bytes, and probes of the grammar with one-byte tokens.

Where a grammar allows only a few characters (after a JSON value: a comma, a closing bracket or
whitespace), the tokens it allows are among those whose first byte it allows, and of those that
begin with whitespace, among those whose second byte it allows after that whitespace. Both are
found by checking one-byte tokens (at most 256, one llama.cpp call), the second after accepting
the first byte into a copy of the grammar. The tokens left are a superset of the allowed ones,
usually a few hundred of a vocabulary's 50,000-262,144, which llama.cpp then checks one by one:
the same tokens as a pass over the whole vocabulary, for a hundredth of its cost. Where the
grammar allows most characters (inside a string) nothing is narrowed and the caller does
otherwise.

The table is built once per loaded model, the first time a redraw needs it: reading every
token's first bytes costs ~1 us a token (~0.05 s for 49,152 tokens, ~0.3 s for 262,144).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING

import numpy as np

from localchat.engine.sampling.grammar import TOKEN_DATA, Grammar

if TYPE_CHECKING:
    from localchat.engine.runtime import LlamaRuntime

NONE = 256  # no such byte: an empty token (a control token), or a one-byte token's second
# Narrow by the second byte only where few first bytes are allowed: each such byte costs a copy
# of the grammar (~80 us), worth it where tokens starting with it are many (whitespace).
SECOND_BYTE_FIRSTS = 4
SECOND_BYTE_MIN_TOKENS = 256


class LeadBytes:
    """Every token's first and second byte, the tokens grouped by first byte, and for each byte
    a token that is that byte alone (the probes)."""

    def __init__(self, runtime: LlamaRuntime) -> None:
        import llama_cpp

        n_vocab, vocab = runtime.n_vocab, runtime.vocab
        self.first = np.full(n_vocab, NONE, dtype=np.int16)
        self.second = np.full(n_vocab, NONE, dtype=np.int16)
        probe = np.full(NONE, -1, dtype=np.int32)
        ends = []
        # One reused buffer and no per-token objects: ~1 us a token (262,144 in ~0.3 s), where
        # reading every piece as bytes took twice that and kept them all.
        to_piece, is_end = llama_cpp.llama_token_to_piece, llama_cpp.llama_vocab_is_eog
        buf = ctypes.create_string_buffer(256)
        for token in range(n_vocab):
            length = to_piece(vocab, token, buf, 256, 0, False)
            head = buf.raw[:2] if length > 0 else b""
            if length > 0:
                self.first[token] = head[0]
                if length > 1:
                    self.second[token] = head[1]
                elif probe[head[0]] < 0:
                    probe[head[0]] = token
            # Ends of generation are the grammar's to allow by its state, whatever their text
            # (control tokens have none; a few vocabularies write <|im_end|> as text).
            if (length <= 0 or head[:1] == b"<") and is_end(vocab, token):
                ends.append(token)
        self.probe = probe
        # Special tokens shown as text (a tool call's marker): the grammar judges them by that
        # text, which the table above does not hold; they are candidates whatever it allows.
        self.end_tokens = np.array([*ends, *runtime.text_tokens], dtype=np.int32)
        self.by_first = np.argsort(self.first, kind="stable").astype(np.int32)
        self.starts = np.searchsorted(self.first[self.by_first], np.arange(NONE + 2)).astype(np.int64)
        self.counts = np.diff(self.starts)

    def tokens_starting(self, byte: int) -> np.ndarray:
        return self.by_first[self.starts[byte]:self.starts[byte + 1]]

    def candidates(self, grammar: Grammar, limit: int) -> np.ndarray | None:
        """The ids of a superset of the tokens ``grammar`` allows next (ends of generation
        included), or None when that set would be larger than ``limit``."""
        firsts = np.flatnonzero(self._allowed_bytes(grammar)).tolist()
        if int(self.counts[firsts].sum()) <= limit:
            return np.concatenate([self.end_tokens, *(self.tokens_starting(b) for b in firsts)])
        # Bytes many tokens begin with (whitespace, above all): narrowed by their second byte.
        many = {b for b in firsts if self.counts[b] >= SECOND_BYTE_MIN_TOKENS and self.probe[b] >= 0}
        if len(many) > SECOND_BYTE_FIRSTS:
            return None
        parts = [self.end_tokens]
        for byte in firsts:
            tokens = self.tokens_starting(byte)
            if byte in many:
                after = self._allowed_bytes(grammar, then=int(self.probe[byte]))
                after = np.append(after, True)  # a one-byte token: its first byte was enough
                tokens = tokens[after[self.second[tokens]]]
            parts.append(tokens)
        chosen = np.concatenate(parts)
        return chosen if len(chosen) <= limit else None

    def _allowed_bytes(self, grammar: Grammar, then: int | None = None) -> np.ndarray:
        """For each byte, whether a token may begin with it next (after the token ``then``, in
        a copy of the grammar, if given). Bytes without a probe token count as allowed."""
        probes = self.probe[self.probe >= 0]
        window = np.zeros(len(probes), dtype=TOKEN_DATA)
        window["id"] = probes
        if then is None:
            grammar.mask(window)
        else:
            with grammar.copy() as copy:
                copy.accept(then)
                copy.mask(window)
        allowed = np.ones(NONE, dtype=bool)
        allowed[self.first[probes]] = window["logit"] != -np.inf
        return allowed


_tables: weakref.WeakKeyDictionary[LlamaRuntime, LeadBytes] = weakref.WeakKeyDictionary()


def lead_bytes(runtime: LlamaRuntime) -> LeadBytes:
    """The model's table, built the first time it is asked for."""
    table = _tables.get(runtime)
    if table is None:
        table = _tables[runtime] = LeadBytes(runtime)
    return table
