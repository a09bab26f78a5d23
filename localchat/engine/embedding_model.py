"""An embedding GGUF (nomic-embed-text, bge, ...) loaded beside the chat model: its own weights
and an ``embedder.EmbeddingContext`` pooled as its header says (``llama_pooling_type``: CLS for
BGE, MEAN for nomic, LAST for Qwen3-Embedding). A :class:`embedder.TextEmbedder`.

Runs on its caller's thread (the server's queue), one request at a time (a lock); it shares
nothing with the chat engine, so a chat's cache is never touched.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localchat.engine import llama_log
from localchat.engine.embedder import EmbeddingContext
from localchat.engine.runtime import physical_cores
from localchat.errors import EngineError


class EmbeddingModel:
    """The weights of ``path`` and an embeddings context of up to ``n_ctx`` tokens an input
    (no more than the model was trained for). Raises EngineError when it cannot be loaded or
    gives no vector per text (a chat model's GGUF says no pooling)."""

    def __init__(self, path: Path, name: str, n_ctx: int, n_threads: int = 0) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaModel

        self.name = name
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 999 if llama_cpp.llama_supports_gpu_offload() else 0
        llama_log.start_load()
        try:
            with llama_log.quiet_stderr():
                self._model = LlamaModel(path_model=str(path), params=params, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(llama_log.load_failure(path, exc)) from None
        trained = self._model.n_ctx_train()
        try:
            self._context = EmbeddingContext(
                self._model.model, n_ctx=min(n_ctx, trained) if trained > 0 else n_ctx,
                n_threads=n_threads or physical_cores(), pooling=None)
        except EngineError:
            self._model.close()
            raise
        self.n_ctx = self._context.n_ctx
        self.n_embd = self._context.n_embd
        self.n_vocab = self._model.n_vocab()
        self._lock = threading.Lock()

    @property
    def pooling(self) -> int:
        return self._context.pooling

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        # add_special: BERT's CLS and SEP (an EOS where the vocabulary asks for one, as the
        # last-token pooling of Qwen3-Embedding needs); text never becomes special tokens.
        return [self._model.tokenize(text.encode("utf-8"), True, False) for text in texts]

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        with self._lock:
            return self._context.embed(inputs)

    def close(self) -> None:
        with self._lock:
            self._context.close()
            self._model.close()
