"""The reply being generated, shared between the UI and the worker thread that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.chat.conversation import Conversation
from localchat.events import PrefillProgress
from localchat.tui.chat_log import ReplyView
from localchat.tui.messages import ThinkingRun, TokenRun, TurnMailbox
from localchat.tui.status import LiveMeter, StatusInfo

if TYPE_CHECKING:
    from localchat.events import Turn


@dataclass
class ActiveTurn:
    """One running reply. The worker sets ``handle`` and fills ``mailbox``; the UI sets
    ``stop_requested`` and shows what arrives. Each side checks the other's field after setting
    its own, so a stop pressed before the turn has started is never lost."""

    id: int
    conversation: Conversation
    reply: ReplyView | None  # None once the user switched away from its session
    mailbox: TurnMailbox
    meter: LiveMeter
    context_before: int = 0  # tokens in context when the turn started (for the live estimate)
    prefill_total: int = 0
    handle: Turn | None = None
    stop_requested: bool = False

    def stop(self) -> None:
        self.stop_requested = True
        if self.handle is not None:
            self.handle.stop()

    async def show_progress(self, event: TokenRun | ThinkingRun | PrefillProgress, info: StatusInfo) -> None:
        """Show new reply text (reasoning or answer) or prefill progress, and the live numbers."""
        if isinstance(event, PrefillProgress):
            self.prefill_total = event.total
            info.state = f"prefilling {event.done}/{event.total}"
            return
        self.meter.token(event.count)
        thinking = isinstance(event, ThinkingRun)
        info.state = "thinking" if thinking else "generating"
        self.meter.apply(info)
        # An estimate until Done brings the engine's count (trimming may lower it).
        info.n_ctx_used = self.context_before + self.prefill_total + self.meter.tokens
        if event.text and self.reply is not None:
            await (self.reply.think(event.text) if thinking else self.reply.append(event.text))
