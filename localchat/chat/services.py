"""What a stored conversation uses besides its engine, built once from config.toml: the user's
settings (the context budget), KV snapshots of sessions (none when ``[snapshots] enabled =
false``), an escalator per session (inert while ``[remote]`` is off; in mode "ask" it
remembers the user's answer for that session), and the tools (``chat.tools.ChatTools``: mcp.json's
servers start in the background when the services are built)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.chat.snapshots import SessionSnapshots
    from localchat.chat.tools import ChatTools
    from localchat.remote.escalate import AskUser, Escalator
    from localchat.settings import Settings


@dataclass
class ChatServices:
    config: Settings
    snapshots: SessionSnapshots | None  # None: sessions are not snapshotted
    new_escalator: Callable[[], Escalator]
    tools: ChatTools | None = None  # None: turns offer no tools

    def close(self) -> None:
        """Wait for snapshot writes in progress and end the tool servers (before the process
        exits)."""
        if self.snapshots is not None:
            self.snapshots.flush()
        if self.tools is not None:
            self.tools.close()


def session_snapshots(config: Settings) -> SessionSnapshots | None:
    """The KV snapshots of stored sessions, capped at ``[snapshots] max_bytes`` on disk; None
    when ``[snapshots] enabled = false`` (nothing is saved or restored)."""
    from localchat import paths
    from localchat.chat.snapshots import SessionSnapshots

    if not config.snapshots.enabled:
        return None
    cap = config.snapshots.max_bytes
    return SessionSnapshots.on_disk(paths.snapshots_dir(), cap)


def build_services(config: Settings | None = None, *, ask_user: AskUser | None = None,
                   tools: bool = True) -> ChatServices:
    """Services from ``config`` (by default config.toml's; raises ``ConfigError``). ``tools``:
    start mcp.json's servers and the ``[tools]`` built-ins (in the background)."""
    from localchat.chat.tools import ChatTools
    from localchat.remote.escalate import Escalator
    from localchat.settings import load_config

    config = config or load_config()
    remote = config.remote
    return ChatServices(config, session_snapshots(config),
                        lambda: Escalator.from_settings(remote, ask_user=ask_user),
                        ChatTools.open(config) if tools else None)
