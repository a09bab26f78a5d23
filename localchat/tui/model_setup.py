"""How the app gets from a model name to an engine and sampling settings.

Delegates to ``localchat.engine.factory`` so the app runs a model exactly as ``ask`` and
``bench`` do. The heavy imports (llama.cpp) happen inside the functions, on the loading thread,
so the window opens at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling
    from localchat.remote.escalate import Escalator
    from localchat.session.snapshots import SessionSnapshots
    from localchat.settings import Settings


@dataclass
class ChatServices:
    """What a conversation with a real engine uses besides the engine: the user's settings (the
    context budget), KV snapshots of sessions, and an escalator per session (inert while
    [remote] is off; in mode "ask" it remembers the user's answer for that session)."""

    config: Settings
    snapshots: SessionSnapshots
    new_escalator: Callable[[], Escalator]

    def close(self) -> None:
        self.snapshots.flush()


def build_services(ask_user: Callable[[str], bool] | None = None) -> ChatServices:
    """Services from config.toml. Raises ``ConfigError``."""
    from localchat import paths
    from localchat.engine.snapshot_file import SnapshotStore
    from localchat.remote.escalate import Escalator
    from localchat.session.snapshots import SessionSnapshots
    from localchat.settings import load_config

    config = load_config()
    snapshots = SessionSnapshots(SnapshotStore(paths.snapshots_dir(), config.snapshots.max_bytes))
    return ChatServices(config, snapshots,
                        lambda: Escalator.from_settings(config.remote, ask_user=ask_user))


def build_engine(model_ref: str | None) -> Engine:
    """An engine (not yet loaded) for ``model_ref`` (registry name, ``hf:`` reference, path or
    None for the configured default). Raises ``ModelNotFound`` (whose message names the
    ``localchat pull`` command when the file is not downloaded) or ``ConfigError``."""
    from localchat.engine.factory import open_engine

    return open_engine(model_ref)


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
        return [(name, is_downloaded(registry[name])) for name in sorted(registry)]
    except UserError:
        return []
