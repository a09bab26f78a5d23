"""Whether llama.cpp's own grammar engine accepts a text: the test model's vocabulary (loaded
alone, no weights), a grammar sampler, and the text fed through it token by token the way
sampling feeds it (each token checked before it is accepted, the end of generation allowed only
where the grammar is complete). For testing grammars without sampling from a model."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as L


class GrammarProbe:
    def __init__(self, model: Path) -> None:
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(str(model).encode(), params)
        assert self.model, model
        self.vocab = L.llama_model_get_vocab(self.model)
        self.eos = L.llama_vocab_eos(self.vocab)
        self._one = (L.llama_token_data * 1)()
        self._array = L.llama_token_data_array(self._one, 1, -1, False)

    def tokens(self, text: str) -> list[int]:
        data = text.encode()
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        assert n >= 0
        return list(buf[:n])

    def accepts(self, grammar: str, text: str, complete: bool = True) -> bool:
        """Whether ``text`` is what the grammar allows (``complete``: all of it, so that the
        reply may end there; else a start of it)."""
        sampler = L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert sampler, "the grammar does not parse"
        try:
            for token in self.tokens(text):
                if not self._allowed(sampler, token):
                    return False
                L.llama_sampler_accept(sampler, token)
            return self._allowed(sampler, self.eos) if complete else True
        finally:
            L.llama_sampler_free(sampler)

    def _allowed(self, sampler, token: int) -> bool:
        self._one[0].id, self._one[0].logit = token, 1.0
        self._array.size = 1
        L.llama_sampler_apply(sampler, ctypes.byref(self._array))
        return self._one[0].logit != float("-inf")

    def close(self) -> None:
        L.llama_model_free(self.model)
