"""Writing the user's ``models.toml`` (``import`` adds an entry, ``rm`` of an imported model
takes it out): atomically, keeping the user's comments and other entries, and through a symbolic
link to the file it points at (a dotfiles checkout keeps its link)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from localchat import paths
from localchat.atomic import write_text_atomic
from localchat.errors import ConfigError
from localchat.settings.toml import read_toml_file, settings_file_present


def add_user_entry(name: str, values: dict[str, Any]) -> Path:
    """Append ``[models.NAME]`` to the user's models.toml, atomically, keeping its comments.

    The caller makes sure ``name`` is not defined there yet. Returns the file written.
    """
    registry_file = paths.user_registry_file()
    text = read_toml_file(registry_file)[1] if settings_file_present(registry_file) else ""
    if text and not text.endswith("\n"):
        text += "\n"
    import tomli_w  # only here: writing entries is rare, start-up should not pay for it

    block = tomli_w.dumps({"models": {name: values}})
    # Through a link (a dotfiles checkout), to the file it points at: the link stays.
    write_text_atomic(registry_file.resolve(), text + ("\n" if text else "") + block)
    return registry_file


def remove_user_entry(name: str) -> bool:
    """Delete the ``[models.NAME]`` table (and its sub-tables) from the user's models.toml.

    Returns whether one was found. Other entries and comments are left as they were (a comment
    between the entry and the next table goes with the entry).
    """
    import tomlkit  # only here, like tomli_w above

    registry_file = paths.user_registry_file()
    if not settings_file_present(registry_file):
        return False
    try:
        document = tomlkit.parse(read_toml_file(registry_file)[1])
    except tomlkit.exceptions.ParseError as exc:
        reason = re.sub(r" at line \d+ col \d+$", "", str(exc))
        raise ConfigError(f"{registry_file}:{exc.line}: invalid TOML: {reason}") from None
    models = document.get("models")
    if not isinstance(models, dict) or name not in models:
        return False
    del models[name]
    write_text_atomic(registry_file.resolve(), tomlkit.dumps(document))
    return True
