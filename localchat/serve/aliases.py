"""Other names the served model answers to (``--alias NAME``, ``[serve] aliases``), for tools
that hard-code a model's name (``gpt-3.5-turbo``, ``llama3``): a request naming an alias is
answered by the model serve was started with (``--model``, else ``default_model``), and the
listings (``/v1/models``, ``/api/tags``) show each alias beside it, so a client that checks the
name it wants is listed finds it.

An alias that is also a model's name (a downloaded one, or one in the registry) would make that
name mean two things: serve refuses to start, in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TypeVar

from localchat.errors import UserError

MAX_ALIAS_CHARS = 128

Model = TypeVar("Model", bound=Any)  # model_host.ServedModel (which imports this module)


class Aliases:
    """The aliases of one model, ``target`` (its name)."""

    def __init__(self, names: Iterable[str], target: str, taken: Iterable[str]) -> None:
        """``taken``: the names of real models, which no alias may take (UserError)."""
        self.target = target
        self.names: tuple[str, ...] = tuple(dict.fromkeys(n.strip() for n in names))
        real = {name.lower() for name in taken} | {target.lower()}
        for name in self.names:
            if not name or len(name) > MAX_ALIAS_CHARS or any(c.isspace() for c in name):
                raise UserError(f"--alias {name!r}: an alias is a name of 1 to "
                                f"{MAX_ALIAS_CHARS} characters without spaces")
            if name.partition(":")[0].lower() in real:
                raise UserError(f"--alias {name}: that is the name of a model; an alias must be "
                                "a name no model has")

    def __bool__(self) -> bool:
        return bool(self.names)

    def matches(self, asked: str) -> bool:
        """Whether ``asked`` names an alias (also with Ollama's ``:latest``)."""
        asked = asked.lower()
        return any(asked in (name.lower(), _tagged(name).lower()) for name in self.names)

    def listed(self, model: Model) -> list[Model]:
        """``model`` (the target) under each alias, for the listings."""
        return [replace(model, name=name) for name in self.names]


def _tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"
