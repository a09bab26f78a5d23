"""A turn that may be handed to the remote model: the session's router over an ``Escalator``.

``ChatContext.send`` takes any :class:`~localchat.context.chat_context.TurnRouter` and knows no remote;
this is the one the app and ``ask`` pass when ``[remote]`` is on. It hands the escalator the local
model's parameter count (``TurnEngine.n_params``, read from the GGUF once, at load), since that
sets how readily a turn escalates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the escalator itself pulls in httpx: only the caller that has one imports it
    from localchat.context.turn_engine import TurnEngine
    from localchat.engine.options import Sampling
    from localchat.events import Turn
    from localchat.remote.escalate import Escalator, Route


@dataclass
class Escalation:
    """Route one turn through ``escalator``: ``route`` "auto" lets its router and confidence
    monitor decide, "remote" sends it away, "local" keeps it home."""

    escalator: Escalator
    engine: TurnEngine  # the local engine: its parameter count (read at load) sets how readily a turn escalates
    route: Route = "auto"

    @property
    def takes_overlong(self) -> bool:
        return self.escalator.client is not None and self.route != "local"

    def start(self, messages: list[dict[str, str]], local: Callable[[], Turn], *,
              overlong: bool, sampling: Sampling) -> Turn:
        # A message the local context cannot hold goes to the remote, if there is one.
        how: Route = "remote" if overlong else self.route
        return self.escalator.start_turn(messages, local, route=how, sampling=sampling,
                                         local_params=self.engine.n_params)

