"""How the app gets from a model name to an engine and sampling settings.

Delegates to ``localchat.engine.factory`` so the app runs a model exactly as ``ask`` and
``bench`` do. The heavy imports (llama.cpp) happen inside the functions, on the loading thread,
so the window opens at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling


def build_engine(model_ref: str | None, speculative: str | None = None) -> Engine:
    """An engine (not yet loaded) for ``model_ref`` (registry name, ``hf:`` reference, path or
    None for the configured default), with the ``--speculative`` mode if one was given. Raises
    ``ModelNotFound`` (whose message names the ``localchat pull`` command when the file is not
    downloaded) or ``ConfigError``."""
    from localchat.engine.factory import open_engine

    return open_engine(model_ref, speculative=speculative)


def default_sampling() -> Sampling:
    """Sampling settings from config.toml's ``[sampling]``. Raises ``ConfigError``."""
    from localchat.engine.factory import sampling_options
    from localchat.settings import load_config

    return sampling_options(load_config())


def model_choices() -> list[tuple[str, bool]]:
    """(registry name, downloaded) for ``/model`` autocomplete, read afresh each time (``localchat
    import`` or ``pull`` may have run meanwhile); empty if the registry cannot be read (the error
    then surfaces with its file and line when the user actually switches)."""
    from localchat.errors import UserError
    from localchat.models.registry import is_downloaded, load_registry

    try:
        registry = load_registry()
        return [(name, is_downloaded(registry[name])) for name in sorted(registry)
                if not registry[name].is_embedding]  # vectors, never a reply
    except UserError:
        return []
