"""A ChatContext kept within its engine's context by the user's context settings."""

from __future__ import annotations

from collections.abc import Sequence

from localchat.context.budget import ContextSettings
from localchat.context.chat_context import ChatContext
from localchat.context.keeper import ContextEngine, ContextKeeper
from localchat.context.message import Message
from localchat.engine.options import Sampling
from localchat.settings import ContextSection, Settings


def context_settings(section: ContextSection, n_ctx: int, max_tokens: int) -> ContextSettings:
    """The context budget from ``[context]`` (already validated by ``load_config``) for a model
    context of ``n_ctx`` tokens and replies of up to ``max_tokens``."""
    return ContextSettings.for_reply(
        n_ctx, max_tokens, trim_fraction=section.trim_fraction,
        summary_max_tokens=section.summary_max_tokens, summarize=section.summarize,
        overlong=section.overlong, summarize_threshold=section.summarize_threshold)


def open_chat(
    engine: ContextEngine,
    settings: Settings,
    *,
    system: str | None = None,
    history: Sequence[Message] = (),
    sampling: Sampling | None = None,
) -> ChatContext:
    """A session over a loaded engine whose context is kept within n_ctx (trim + summaries)."""
    if system is None:
        system = settings.context.system_prompt
    session = ChatContext(engine, system=system, history=tuple(history), sampling=sampling)
    budget = context_settings(settings.context, engine.n_ctx, session.sampling.max_tokens)
    session.keeper = ContextKeeper(engine, budget)
    return session
