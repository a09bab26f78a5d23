"""Loading a model for the engine: weights and context on the layers that fit the GPU, the chat
template's renderer, and whatever drafts tokens for speculative decoding."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localchat.engine.options import EngineOptions
from localchat.engine.preflight import Preflight
from localchat.engine.projector_runtime import Projector, Vision
from localchat.engine.prompts import ModelPrompts
from localchat.engine.runtime import LlamaRuntime
from localchat.engine.speculate import Speculator, build_speculator, plan_speculation
from localchat.engine.templates import make_renderer
from localchat.errors import EngineError
from localchat.events import Loaded


@dataclass
class LoadedModel:
    runtime: LlamaRuntime
    prompts: ModelPrompts
    speculator: Speculator
    notices: list[str]  # what the load could not set up (drafting, images), one line each
    info: Loaded
    vision: Vision = field(default_factory=Vision)  # the image projector, or why none


def load_model(model_path: Path, options: EngineOptions, name: str, checked: Preflight,
               on_progress: Callable[[float], None] | None = None) -> LoadedModel:
    """Load what ``checked`` (the preflight of ``model_path``) found. Raises EngineError."""
    from localchat.engine.offload import resolve_gpu_layers

    started = time.perf_counter()
    if on_progress:
        on_progress(0.0)
    gguf, template = checked.gguf, checked.template
    draft, draft_problem = plan_speculation(options, gguf, name)
    fit = resolve_gpu_layers(options.gpu_layers, gguf, options,
                             reserve_bytes=draft.gpu_bytes if draft is not None else 0)
    if on_progress:
        on_progress(0.1)
    runtime = LlamaRuntime(model_path, options, fit.n_gpu_layers)
    prompts = ModelPrompts(template, make_renderer(template, runtime.bos_text, runtime.eos_text))
    # A family's call marker is a special token: shown as text, so calls can be read.
    runtime.show_as_text(prompts.preserved_tokens)
    speculator, notices = build_speculator(options, runtime, gguf, draft, draft_problem, name)
    vision = Vision()
    if options.mmproj is not None:
        try:
            vision = Vision(Projector(options.mmproj, runtime, use_gpu=fit.offloaded_layers > 0))
        except EngineError as exc:  # the model still chats; an image sent to it says why not
            vision = Vision(None, str(exc))
            notices = [*notices, f"images: {exc}"]
    if on_progress:
        on_progress(1.0)
    info = Loaded(
        model=name,
        n_ctx=runtime.n_ctx,
        gpu_layers=fit.offloaded_layers,
        n_layers=fit.n_layers,
        backend=fit.backend,
        load_ms=(time.perf_counter() - started) * 1000.0,
        memory=runtime.memory_kind,
        speculative=speculator.describe(),
    )
    return LoadedModel(runtime, prompts, speculator, list(notices), info, vision)
