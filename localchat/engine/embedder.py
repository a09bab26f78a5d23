"""Text embeddings from a llama.cpp model: one L2-normalised vector per input.

:class:`EmbeddingContext` is a llama.cpp context with ``embeddings`` on over a loaded
``llama_model`` it does not own, with its own small memory: made over a chat model's weights
(pooling MEAN), it never touches the chat's context or KV cache. Inputs are token lists; several
go into one ``llama_decode`` (each its own sequence id) as long as they fit the batch, and each
comes back pooled by llama.cpp (``llama_get_embeddings_seq``).

Two sources of vectors use it: :class:`ChatModelEmbedder` (the chat engine's own model, run on
the engine thread between turns) and ``engine.embedding_model.EmbeddingModel`` (an embedding
GGUF loaded beside the chat model, pooled as its header says). Both are a :class:`TextEmbedder`.

llama.cpp pools within one micro-batch, so an input never spans two: the per-input limit is the
context's batch size (``n_ctx`` here: batch, micro-batch and context are one size).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from localchat.errors import EngineError

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.kv import ConversationCache

# Sequences in one llama_decode (the API's limit is 64 a call in most clients): very short inputs
# fill a decode of PACK_TOKENS with as many as that.
MAX_SEQUENCES = 64
# Tokens packed into one llama_decode (an input longer than this goes alone): every token of a
# batch attends over every cell of it, masked to its own input, so that work grows with the
# square of the batch; 64 inputs of ~40 tokens embedded in 5.69 s in decodes of 256 tokens, 5.89
# in decodes of 512 (128: 5.80), with the test model on 2 cores.
PACK_TOKENS = 256
# Tokens one input may hold when a chat model embeds: the context is batch-sized, so its compute
# and output buffers grow with this (a 150k-word vocabulary's logits row is 0.6 MB a token).
CHAT_MODEL_N_CTX = 512

POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class TextEmbedder(Protocol):
    """What the server needs of a source of vectors."""

    name: str
    n_ctx: int  # the most tokens one input may hold
    n_vocab: int
    n_embd: int

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text as the model reads it for an embedding (its BOS, or CLS and SEP, added;
        special tokens written in the text stay text)."""
        ...

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One normalised float32 row per input (each 1..``n_ctx`` tokens below ``n_vocab``)."""
        ...


class EmbeddingContext:
    """An embeddings context over ``model`` (a ``llama_model*`` that outlives it)."""

    def __init__(self, model: Any, *, n_ctx: int, n_threads: int, pooling: int | None) -> None:
        """``pooling``: a ``LLAMA_POOLING_TYPE_*`` (None: the model's own, from its GGUF)."""
        import llama_cpp

        self._lib = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        params.n_seq_max = MAX_SEQUENCES
        # One cache for every sequence: split per sequence, each would get n_ctx / 64 cells.
        params.kv_unified = True
        params.embeddings = True
        params.pooling_type = (llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if pooling is None
                               else pooling)
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise EngineError("llama.cpp could not make an embeddings context for the model")
        self.pooling = int(llama_cpp.llama_pooling_type(self.ctx))
        if self.pooling not in (1, 2, 3):  # none gives a vector per token, rank a score
            self.close()
            raise EngineError(f"the model's pooling is {POOLING_NAMES.get(self.pooling, '?')}: "
                              "it gives no vector per text (not an embedding model)")
        self.n_ctx = int(llama_cpp.llama_n_batch(self.ctx))
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One L2-normalised row per input, in order. The inputs are packed into decodes of up
        to :data:`PACK_TOKENS` tokens (a longer input alone) and :data:`MAX_SEQUENCES` inputs."""
        out = np.empty((len(inputs), self.n_embd), dtype=np.float32)
        group: list[int] = []
        used = 0
        for index, tokens in enumerate(inputs):
            if not 0 < len(tokens) <= self.n_ctx:
                raise EngineError(f"an input of {len(tokens)} tokens: 1 to {self.n_ctx} fit")
            if group and (used + len(tokens) > PACK_TOKENS or len(group) == MAX_SEQUENCES):
                self._decode(inputs, group, out)
                group, used = [], 0
            group.append(index)
            used += len(tokens)
        if group:
            self._decode(inputs, group, out)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)

    def _decode(self, inputs: Sequence[Sequence[int]], group: list[int], out: np.ndarray) -> None:
        batch = self._batch
        n = 0
        for seq, index in enumerate(group):
            for pos, token in enumerate(inputs[index]):
                batch.token[n] = token
                batch.pos[n] = pos
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = True  # pooling reads every token's output
                n += 1
        batch.n_tokens = n
        if self._memory:  # a causal model keeps cells; an encoder (BERT) has no memory
            self._lib.llama_memory_clear(self._memory, True)
        status = self._lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status} while embedding")
        for seq, index in enumerate(group):
            pointer = self._lib.llama_get_embeddings_seq(self.ctx, seq)
            if not pointer:
                raise EngineError("llama.cpp returned no pooled embedding")
            out[index] = np.ctypeslib.as_array(
                ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_embd,))

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx:
            self._lib.llama_free(self.ctx)
            self.ctx = None


class ChatModelEmbedder:
    """Vectors from a loaded chat engine's own weights, mean-pooled (weaker than a model trained
    for it, but there without a download). Its context is made on the engine thread at the first
    request and run there between turns; the chat's KV cache is never touched. Close it before
    the engine."""

    def __init__(self, engine: Engine, n_ctx: int = CHAT_MODEL_N_CTX) -> None:
        self.name = engine.name
        self._engine = engine
        self._n_ctx = n_ctx
        self._context: EmbeddingContext | None = None
        self._made_for: object = None  # the runtime the context shares weights with
        self._lock = threading.Lock()
        self.n_ctx, self.n_embd = engine.with_cache(self._ensure)
        self.n_vocab = engine.n_vocab

    def _ensure(self, kv: ConversationCache) -> tuple[int, int]:
        runtime = kv.runtime
        if self._context is None or self._made_for is not runtime:
            if self._context is not None:
                self._context.close()
            import llama_cpp as lib

            n_ctx = min(self._n_ctx, runtime.n_ctx)
            self._context = EmbeddingContext(runtime.model.model, n_ctx=n_ctx,
                                             n_threads=int(lib.llama_n_threads_batch(runtime.ctx)),
                                             pooling=lib.LLAMA_POOLING_TYPE_MEAN)
            self._made_for = runtime
        return self._context.n_ctx, self._context.n_embd

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        def job(kv: ConversationCache) -> list[list[int]]:
            model = kv.runtime.model
            return [model.tokenize(text.encode("utf-8"), kv.runtime.add_bos, False)
                    for text in texts]

        return self._engine.with_cache(job)

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        def job(kv: ConversationCache) -> np.ndarray:
            self._ensure(kv)
            assert self._context is not None
            return self._context.embed(inputs)

        with self._lock:
            return self._engine.with_cache(job)

    def close(self) -> None:
        """Free the context (on the engine thread, after queued work; at once if it has ended)."""
        context, self._context = self._context, None
        if context is None:
            return
        try:
            self._engine.call(context.close)
        except EngineError:  # the engine has closed: nothing else runs on its thread
            context.close()
