"""Preflight: whether a model can be chatted with, decided before any weights load.

One check for every caller: the app runs it before it unloads the model in use (so a bad pick
keeps the current one), and ``Engine.load`` runs it (or takes the result the app's run left), so
the GGUF header is read once per load. It refuses, each in one line written for the user:

- a missing file, or one that is not a GGUF, or one cut short (a copy or download still under
  way: llama.cpp's own refusal only says it failed to load);
- a context size above what the model was trained for (more would only degrade it), wherever
  the size came from: a flag, ``config.toml`` or the registry;
- a chat template that is missing (and the registry names none) or does not compile.

It returns what it read, which the load goes on with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.engine.templates import check_renders, choose_template, make_renderer
from localchat.errors import EngineError

if TYPE_CHECKING:
    from localchat.engine.options import EngineOptions
    from localchat.models.gguf import GGUFInfo


@dataclass(frozen=True)
class Preflight:
    """What preflight read: the GGUF header and the chat template chosen for the model."""

    gguf: GGUFInfo
    template: str

    @property
    def n_params(self) -> int | None:
        """The model's parameter count (None when the header does not tell)."""
        return self.gguf.n_params or None


def preflight(path: Path, name: str, options: EngineOptions) -> Preflight:
    """Check that the model at ``path`` can be loaded with ``options`` and chatted with; cheap
    (reads the GGUF's metadata, loads no weights). Raises ``EngineError`` (or ``GGUFError``)."""
    from localchat.models.gguf import read_gguf

    if not path.is_file():
        raise EngineError(f"model file not found: {path}")
    gguf = read_gguf(path)
    gguf.require_complete()  # a file cut short, or still being written: llama.cpp says only "failed"
    trained = gguf.context_length
    if trained and options.n_ctx > trained:
        raise EngineError(f"n_ctx {options.n_ctx} is more than {name} was trained for ({trained}); "
                          f"use at most {trained}")
    template = choose_template(name, gguf.chat_template, options.chat_template, options.chat_format)
    try:
        check_renders(make_renderer(template, "", ""))  # within a time limit: it may loop
    except Exception as exc:  # a Jinja error, in the template's own words
        raise EngineError(f"{name}'s chat template does not work: {exc}") from None
    return Preflight(gguf, template)
