"""What a stored conversation uses besides its engine, built once from config.toml: the user's
settings (the context budget), KV snapshots of sessions (none when ``[snapshots] enabled =
false``), and an escalator per session (inert while ``[remote]`` is off; in mode "ask" it
remembers the user's answer for that session)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.chat.snapshots import SessionSnapshots
    from localchat.config import Config
    from localchat.remote.escalate import AskUser, Escalator


@dataclass
class ChatServices:
    config: Config
    snapshots: SessionSnapshots | None  # None: sessions are not snapshotted
    new_escalator: Callable[[], Escalator]

    def close(self) -> None:
        """Wait for snapshot writes in progress (before the process exits)."""
        if self.snapshots is not None:
            self.snapshots.flush()


def session_snapshots(config: Config) -> SessionSnapshots | None:
    """The KV snapshots of stored sessions, capped at ``[snapshots] max_bytes`` on disk; None
    when ``[snapshots] enabled = false`` (nothing is saved or restored)."""
    from localchat import paths
    from localchat.chat.snapshots import SessionSnapshots

    if not config.snapshots.get("enabled", True):
        return None
    cap = int(config.snapshots.get("max_bytes", 2 * 1024**3))
    return SessionSnapshots.on_disk(paths.snapshots_dir(), cap)


def build_services(config: Config | None = None, *,
                   ask_user: AskUser | None = None) -> ChatServices:
    """Services from ``config`` (by default config.toml's; raises ``ConfigError``)."""
    from localchat.config import load_config
    from localchat.remote.escalate import Escalator
    from localchat.remote.settings import RemoteSettings

    config = config or load_config()
    remote = RemoteSettings.from_config(config.remote)
    return ChatServices(config, session_snapshots(config),
                        lambda: Escalator.from_settings(remote, ask_user=ask_user))
