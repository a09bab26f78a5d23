"""Type-ahead: a message sent while the model loads or a reply streams waits in a queue, shown
under the conversation as queued, and goes out as soon as the engine is free. Esc removes the
newest queued message (before it stops a reply). Mixed into ``LocalChatApp``.

Queued messages belong to the session they were typed in: leaving it puts their text back into
the input rather than sending it to another conversation or dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.tui.chat_log import QueuedPrompt

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp


@dataclass
class Queued:
    text: str
    route: str
    view: QueuedPrompt


class TypeAhead:
    def must_queue(self: LocalChatApp) -> bool:
        """Whether a message sent now waits: a reply streams, the model is loading, or earlier
        messages are still waiting (order is kept)."""
        return self.turn is not None or bool(self.queued) or (self.engine is None and bool(self.loading_model))

    async def queue_message(self: LocalChatApp, text: str, route: str) -> None:
        view = await self.chat_log.add_queued(text, len(self.queued) + 1)
        self.queued.append(Queued(text, route, view))
        self.refresh_bindings()  # Esc now removes a queued message

    async def send_next_queued(self: LocalChatApp) -> None:
        """Send the oldest queued message if the engine is free (after a reply or a load)."""
        if not self.queued or self.turn is not None or self.engine is None:
            return
        item = self.queued.pop(0)
        await item.view.remove()
        self._renumber_queue()
        await self.send_prompt(item.text, item.route, queued=True)

    async def remove_last_queued(self: LocalChatApp) -> None:
        """Esc: take back the newest queued message (its text returns to an empty input)."""
        item = self.queued.pop()
        await item.view.remove()
        if not self.prompt.text:
            self.prompt.text = item.text
            self.prompt.move_cursor(self.prompt.document.end)
        self.refresh_bindings()
        self.notify("Queued message removed.")

    async def drop_queued(self: LocalChatApp, why: str) -> None:
        """Nothing can send the queue (the model failed, the session was left): its texts go back
        into the input, so nothing typed is lost."""
        if not self.queued:
            return
        texts = [item.text for item in self.queued]
        for item in self.queued:
            await item.view.remove()
        self.queued.clear()
        self.prompt.text = "\n\n".join([*texts, self.prompt.text] if self.prompt.text else texts)
        self.prompt.move_cursor(self.prompt.document.end)
        self.refresh_bindings()
        self.notify(f"{why} Your queued message{'s are' if len(texts) > 1 else ' is'} back in the input.",
                    severity="warning")

    def _renumber_queue(self: LocalChatApp) -> None:
        for position, item in enumerate(self.queued, 1):
            item.view.set_position(position)
