"""A ChatSession wired to a real engine with the user's context settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localchat.config import Config
from localchat.engine.engine import Engine
from localchat.engine.options import Sampling
from localchat.errors import ConfigError
from localchat.session.budget import ContextSettings
from localchat.session.chat import ChatSession, Message
from localchat.session.keeper import ContextKeeper

# config.toml [context] keys that ContextSettings takes (their defaults live in config.py).
CONTEXT_KEYS = ("trim_fraction", "summary_max_tokens", "summarize", "overlong", "summarize_threshold")


def context_settings(section: dict[str, Any], n_ctx: int, max_tokens: int) -> ContextSettings:
    """ContextSettings from config.toml's [context] section; bad values are a ConfigError."""
    values = {key: section[key] for key in CONTEXT_KEYS if key in section}
    try:
        return ContextSettings.for_reply(n_ctx, max_tokens, **values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"config.toml [context]: {exc}") from None


def open_chat(
    engine: Engine,
    config: Config,
    *,
    system: str | None = None,
    history: Sequence[Message] = (),
    sampling: Sampling | None = None,
) -> ChatSession:
    """A session over a loaded engine whose context is kept within n_ctx (trim + summaries)."""
    if system is None:
        system = config.context.get("system_prompt", "")
    session = ChatSession(engine, system=system, history=history, sampling=sampling)
    settings = context_settings(config.context, engine.n_ctx, session.sampling.max_tokens)
    session.keeper = ContextKeeper(engine, settings)
    return session
