"""Building an Engine from a model reference and the user's settings.

Precedence, most specific last: ``config.toml`` ``[engine]``/``[sampling]`` (defaults included,
see ``localchat.settings``) < the model's registry entry < command-line flags. One place, so the
TUI, ``ask`` and ``bench`` run a model the same way.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.errors import UserError
from localchat.models.registry import (
    ModelSpec,
    changed_since_import,
    local_path,
    projector_spec_or_none,
    require_local,
    resolve_model,
)
from localchat.settings import EngineSection, Settings, load_config


def engine_options(spec: ModelSpec, settings: Settings, **overrides: Any) -> EngineOptions:
    """EngineOptions for ``spec``: ``[engine]``, then the registry entry's fields, then
    ``overrides`` (flags; None means not given)."""
    engine = settings.engine
    options = EngineOptions(**{
        **asdict(engine),
        "n_ctx": engine.n_ctx or spec.n_ctx,  # 0 in config = the model's own default
        # Token probabilities feed the escalation router; they cost a softmax per token.
        "track_confidence": settings.remote.mode != "off",
    })
    from_spec = {"gpu_layers": spec.gpu_layers, "chat_format": spec.chat_format,
                 "chat_template": spec.chat_template, "draft_model": _paired_draft(spec, engine)}
    return replace(options, **_given(from_spec, overrides))


def projector_path(spec: ModelSpec) -> Path | None:
    """The registry entry's projector file, when it has one and it is on disk (a model whose
    projector is missing still chats; an image sent to it says what to pull)."""
    projector = projector_spec_or_none(spec)
    if projector is None:
        return None
    path = local_path(projector)
    return path if path.is_file() else None


def _paired_draft(spec: ModelSpec, engine: EngineSection) -> str | None:
    """The draft model: ``[engine] draft_model``, else the one models.toml pairs with ``spec``
    when it is downloaded (a pairing alone never costs a download or an error)."""
    if engine.draft_model or not spec.draft:
        return engine.draft_model
    from localchat.models.registry import is_downloaded

    try:
        return spec.draft if is_downloaded(resolve_model(spec.draft)) else None
    except UserError:
        return None


def sampling_options(settings: Settings, **overrides: Any) -> Sampling:
    """Sampling from ``[sampling]`` (seed -1 = random), then ``overrides`` (None = not given)."""
    sampling = Sampling(**asdict(settings.sampling))
    return replace(sampling, **_given(overrides))


def _given(*layers: dict[str, Any]) -> dict[str, Any]:
    """The layers merged, later ones winning, without the values that are None (not given)."""
    return {key: value for layer in layers for key, value in layer.items() if value is not None}


def open_engine(model: str | None, settings: Settings | None = None, **overrides: Any) -> Engine:
    """An Engine for ``model`` (registry name, hf: reference or .gguf path; None = the default),
    not yet loaded. Raises ModelNotFound (with the pull command to run) when it is not on disk."""
    settings = settings or load_config()
    spec = resolve_model(model or settings.default_model)
    if spec.is_embedding:
        raise UserError(f"{spec.name} is an embedding model: it turns text into vectors and "
                        "cannot chat; `localchat serve` answers /v1/embeddings with it")
    path = require_local(spec)
    options = engine_options(spec, settings, **overrides)
    if options.mmproj is None:
        options = replace(options, mmproj=projector_path(spec))
    # A size llama.cpp would silently raise (below its 256-token step) is refused here; one above
    # what the model was trained for is refused by the engine's preflight, wherever it came from.
    from localchat.engine.runtime import check_n_ctx_floor

    check_n_ctx_floor(options.n_ctx, zero_is_default=True)
    changed = changed_since_import(spec)
    return Engine(path, options, name=spec.name, notices=[changed] if changed else [])
