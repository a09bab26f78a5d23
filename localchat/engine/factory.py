"""Building an Engine from a model reference and the user's settings.

Precedence, most specific last: built-in defaults < config.toml ``[engine]``/``[sampling]`` <
the model's registry entry < command-line flags. One place, so the TUI, ``ask`` and ``bench``
run a model the same way.
"""

from __future__ import annotations

from typing import Any

from localchat.config import Config, load_config
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling, merged
from localchat.errors import EngineError
from localchat.models.registry import ModelSpec, require_local, resolve_model


def engine_options(spec: ModelSpec, config: Config, **overrides: Any) -> EngineOptions:
    settings = dict(config.engine)
    if not settings.get("n_ctx"):
        settings["n_ctx"] = spec.n_ctx  # 0 in config = the model's own default
    if not settings.get("n_threads"):
        settings["n_threads"] = None
    from_spec = {
        "gpu_layers": spec.gpu_layers,
        "chat_format": spec.chat_format,
        "chat_template": spec.chat_template,
        # Token probabilities feed the escalation router; they cost a softmax per token.
        "track_confidence": config.remote.get("mode", "off") != "off",
    }
    return merged(EngineOptions, settings, from_spec, overrides)


def sampling_options(config: Config, **overrides: Any) -> Sampling:
    settings = dict(config.sampling)
    if settings.get("seed", -1) < 0:
        settings["seed"] = None
    return merged(Sampling, settings, overrides)


def open_engine(model: str | None, config: Config | None = None, **overrides: Any) -> Engine:
    """An Engine for ``model`` (registry name, hf: reference or .gguf path; None = the default),
    not yet loaded. Raises ModelNotFound (with the pull command to run) when it is not on disk."""
    config = config or load_config()
    spec = resolve_model(model or config.default_model)
    path = require_local(spec)
    options = engine_options(spec, config, **overrides)
    _check_n_ctx(path, spec.name, options.n_ctx, explicit=bool(overrides.get("n_ctx")))
    return Engine(path, options, name=spec.name)


def _check_n_ctx(path, name: str, n_ctx: int, *, explicit: bool) -> None:
    """A context size that llama.cpp would silently raise (below its 256-token step) is refused;
    so is an ``explicit`` one (a flag) that the engine would silently lower to the model's
    training length (a registry default beyond it is lowered, as before)."""
    from localchat.engine.runtime import check_n_ctx_floor
    from localchat.models.gguf import read_gguf

    check_n_ctx_floor(n_ctx, zero_is_default=True)
    trained = read_gguf(path).context_length if explicit else None
    if trained and n_ctx > trained:
        raise EngineError(f"n_ctx {n_ctx} is more than {name} was trained for ({trained}); "
                          f"use at most {trained}")
