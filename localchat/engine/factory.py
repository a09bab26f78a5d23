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
    if overrides.get("n_ctx"):
        _check_trained_length(path, spec.name, overrides["n_ctx"])
    return Engine(path, engine_options(spec, config, **overrides), name=spec.name)


def _check_trained_length(path, name: str, n_ctx: int) -> None:
    """An explicit n_ctx beyond what the model was trained for is refused, not quietly lowered."""
    from localchat.models.gguf import read_gguf

    trained = read_gguf(path).context_length
    if trained and n_ctx > trained:
        raise EngineError(f"n_ctx {n_ctx} is more than {name} was trained for ({trained}); "
                          f"use at most {trained}")
