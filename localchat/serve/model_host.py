"""Which models ``localchat serve`` answers with, and the one loaded.

A request names a model by its registry name (``smollm2-135m``), an Ollama-style alias of it
(``smollm2-135m:latest``, or the tag of its quantization, ``smollm2-135m:q4_1``), the name of
the model given with ``--model``, or a name given with ``--alias`` for the model served first
(``aliases``). Only downloaded registry models and that one are served: the name is looked up
in that list, never resolved, so no path or ``hf:`` reference a request sends
is ever read, loaded or downloaded. Anything else is a 404 that says how to get the model
(``localchat pull``).

One model is loaded at a time, answering ``parallel`` requests at once (``engine.slots``; one:
the plain engine, with speculative decoding if configured). The scheduler asks for the model of
each request in turn (``acquire``), so a request for another model switches once the requests
before it are done;
the saved conversation states (``engine.state_pool``) belong to the model they were made with
and are dropped with it.

Embeddings (``embeddings``) come from an embedding model of the registry (``kind =
"embedding"``), loaded beside the chat model (one at a time, kept until another is asked for),
or from the chat model itself, mean-pooled in a small context of its own
(``engine.embedder.ChatModelEmbedder``) that leaves the chat's cache as it was. A chat request
that names an embedding model is a 400 (:meth:`ModelHost.resolve_chat`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from localchat.engine.embedder import ChatModelEmbedder, TextEmbedder
from localchat.engine.embedding_model import EmbeddingModel
from localchat.engine.engine import Engine
from localchat.engine.factory import engine_options, projector_path, sampling_options
from localchat.engine.options import Sampling
from localchat.engine.slots.parallel import ParallelEngine
from localchat.engine.state_pool import StatePool
from localchat.errors import UserError
from localchat.models.registry import (
    HF_PREFIX,
    ModelSpec,
    is_downloaded,
    load_registry,
    local_path,
)
from localchat.serve.aliases import Aliases
from localchat.serve.http_errors import NotFound, bad
from localchat.settings import Settings


@dataclass(frozen=True)
class ServedModel:
    name: str
    spec: ModelSpec
    path: Path

    @property
    def tag(self) -> str:
        """Its Ollama-style name (``name:latest``), as ``/api/tags`` lists it."""
        return self.name if ":" in self.name else f"{self.name}:latest"

    def answers_to(self, asked: str) -> bool:
        name, _, tag = asked.partition(":")
        if name.lower() != self.name.lower():
            return False
        return not tag or tag.lower() in ("latest", self.spec.quant.lower())


EngineFactory = Callable[[ServedModel], Engine]


class ModelHost:
    """The served models and the loaded engine with its state pool."""

    def __init__(self, config: Settings, pinned: ModelSpec | None = None, *,
                 n_ctx: int | None = None, cache_bytes: int = 0,
                 engine_factory: EngineFactory | None = None,
                 aliases: tuple[str, ...] = (), parallel: int | None = None) -> None:
        """``aliases``: other names of the model served first (``serve.aliases``); UserError for
        one that is a model's name. ``parallel``: requests answered at once (``engine.slots``;
        default ``[serve] parallel``)."""
        self.config = config
        self.parallel = parallel or config.serve.parallel
        self.pinned = pinned
        self.n_ctx = n_ctx
        self.sampling: Sampling = sampling_options(config)
        self.pool = StatePool(cache_bytes)
        self._factory = engine_factory or self._open
        self._lock = threading.Lock()
        self._catalogue: list[ServedModel] = []
        self.loaded: ServedModel | None = None
        self.engine: Engine | None = None
        self._chat_embedder: ChatModelEmbedder | None = None
        self._embedding: EmbeddingModel | None = None  # the embedding model loaded beside
        self.refresh()
        target = pinned.name if pinned is not None else config.default_model
        taken = [*load_registry(), *(model.name for model in self.catalogue)]
        self.aliases = Aliases(aliases, target, taken)

    # -- which models ---------------------------------------------------------------------------

    def refresh(self) -> list[ServedModel]:
        """Read the registry again (a model pulled while serve runs appears); the list."""
        served = []
        if self.pinned is not None:
            served.append(ServedModel(self.pinned.name, self.pinned, local_path(self.pinned)))
        for spec in load_registry().values():
            if self.pinned is not None and spec.name == self.pinned.name:
                continue
            try:
                if is_downloaded(spec):
                    served.append(ServedModel(spec.name, spec, local_path(spec)))
            except UserError:  # an entry whose file name cannot be a path: not servable
                continue
        with self._lock:
            self._catalogue = served
        return served

    def listed(self) -> list[ServedModel]:
        """What the listings show: :meth:`refresh`'s list, then the model the aliases stand
        for under each alias."""
        served = self.refresh()
        target = next((m for m in served if m.name == self.aliases.target), None)
        return served if target is None else [*served, *self.aliases.listed(target)]

    @property
    def catalogue(self) -> list[ServedModel]:
        with self._lock:
            return list(self._catalogue)

    def default(self) -> ServedModel:
        """The model of a request that names none: the loaded one, else ``--model``, else the
        configured default model."""
        if self.loaded is not None:
            return self.loaded
        return self.resolve(self.pinned.name if self.pinned else self.config.default_model)

    def resolve(self, asked: str | None) -> ServedModel:
        """The served model ``asked`` names (None or "": the default); NotFound (404) otherwise."""
        if not asked:
            return self.default()
        if self.aliases.matches(asked):
            asked = self.aliases.target
        for refreshed in (False, True):
            if refreshed:
                self.refresh()
            for model in self.catalogue:
                if model.answers_to(asked):
                    return model
        raise NotFound(self._not_found(asked), code="model_not_found", param="model")

    def resolve_chat(self, asked: str | None) -> ServedModel:
        """``resolve``, refusing (400) an embedding model: it has no replies to give."""
        model = self.resolve(asked)
        if model.spec.is_embedding:
            raise bad("model", f"{model.name!r} is an embedding model: it answers /v1/embeddings "
                               "and /api/embed, not chats")
        return model

    def _not_found(self, asked: str) -> str:
        if asked.startswith(HF_PREFIX) or "/" in asked or "\\" in asked or asked.endswith(".gguf"):
            return (f"model {asked!r}: models are named over the API, never given as files or hf: "
                    "references; `localchat pull REF` downloads one, `localchat models` lists names")
        name = asked.partition(":")[0]
        if name in load_registry():
            return f"model {name!r} is not downloaded; run `localchat pull {name}`"
        return (f"model {asked!r} is unknown; `localchat models` lists the catalogue and "
                "`localchat pull NAME` downloads one")

    # -- the loaded one (scheduler thread) ------------------------------------------------------

    def acquire(self, model: ServedModel) -> tuple[Engine, StatePool, float]:
        """The engine for ``model``, loading it (and closing the one loaded) if needed; with the
        state pool and how long the load took (0: it was loaded). Raises UserError."""
        if self.engine is not None and self.loaded == model:
            return self.engine, self.pool, 0.0
        started = time.perf_counter()
        self.unload()
        engine = self._factory(model)
        self.engine, self.loaded = engine, model
        return engine, self.pool, (time.perf_counter() - started) * 1000.0

    def embedder(self, model: ServedModel) -> tuple[TextEmbedder, float]:
        """What embeds for ``model`` (an embedding model, loaded beside the chat model if it is
        not yet, or a chat model, loaded as ``acquire`` does), with how long loading took (ms).
        Raises UserError."""
        started = time.perf_counter()
        if model.spec.is_embedding:
            if self._embedding is None or self._embedding.name != model.name:
                self._close_embedding()
                self._embedding = EmbeddingModel(model.path, model.name, model.spec.n_ctx,
                                                 self.config.engine.n_threads)
            return self._embedding, (time.perf_counter() - started) * 1000.0
        engine, _, load_ms = self.acquire(model)
        if self._chat_embedder is None:
            self._chat_embedder = ChatModelEmbedder(engine)
        return self._chat_embedder, load_ms

    def _close_embedding(self) -> None:
        embedding, self._embedding = self._embedding, None
        if embedding is not None:
            embedding.close()

    def close(self) -> None:
        """Unload everything (the server has stopped)."""
        self.unload()
        self._close_embedding()

    def unload(self) -> None:
        if self._chat_embedder is not None:  # its context shares the engine's weights
            self._chat_embedder.close()
            self._chat_embedder = None
        self.pool.clear()
        engine, self.engine, self.loaded = self.engine, None, None
        if engine is not None:
            engine.close()

    def _open(self, model: ServedModel) -> Engine:
        from localchat.engine.runtime import check_n_ctx_floor

        options = engine_options(model.spec, self.config, n_ctx=self.n_ctx)
        options = replace(options, parallel=self.parallel,
                          mmproj=options.mmproj or projector_path(model.spec))
        check_n_ctx_floor(options.n_ctx, zero_is_default=True)
        engine = (ParallelEngine(model.path, options, name=model.name) if self.parallel > 1
                  else Engine(model.path, options, name=model.name))
        try:
            engine.load()
        except BaseException:
            engine.close()
            raise
        return engine
