"""Type-ahead: a message sent while the model loads or a reply streams waits in a queue, shown
under the conversation as queued, and goes out as soon as the engine is free. Esc removes the
newest queued message (before it stops a reply).

Queued messages belong to the session they were typed in: leaving it puts their text back into
the input rather than sending it to another conversation or dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual.app import App

from localchat.tui.chat_log import ChatLog, QueuedPrompt
from localchat.tui.prompt import PromptInput

if TYPE_CHECKING:
    from localchat.tui.model_state import ModelState
    from localchat.tui.turn import Turns


@dataclass
class Queued:
    text: str
    route: str
    view: QueuedPrompt


class TypeAhead:
    """The queue of messages waiting for the engine, oldest first, each shown under the log:
    they wait for ``turns`` to be idle and ``models`` to have an engine."""

    def __init__(self, app: App[Any], turns: Turns, models: ModelState) -> None:
        self._app = app
        self._turns = turns
        self._models = models
        self.items: list[Queued] = []

    def must_queue(self) -> bool:
        """Whether a message sent now waits: a reply streams, the model is loading, or earlier
        messages are still waiting (order is kept)."""
        models = self._models
        return self._turns.current is not None or bool(self.items) \
            or (models.engine is None and bool(models.loading))

    async def add(self, text: str, route: str) -> None:
        view = await self._app.query_one(ChatLog).add_queued(text, len(self.items) + 1)
        self.items.append(Queued(text, route, view))
        self._app.refresh_bindings()  # Esc now removes a queued message

    async def send_next(self) -> None:
        """Send the oldest queued message if the engine is free (after a reply or a load)."""
        if not self.items or self._turns.current is not None or self._models.engine is None:
            return
        item = self.items.pop(0)
        await item.view.remove()
        self._renumber()
        await self._turns.send(item.text, item.route, queued=True)

    async def remove_last(self) -> None:
        """Esc: take back the newest queued message (its text returns to an empty input)."""
        item = self.items.pop()
        await item.view.remove()
        prompt = self._app.query_one(PromptInput)
        if not prompt.text:
            prompt.text = item.text
            prompt.move_cursor(prompt.document.end)
        self._app.refresh_bindings()
        self._app.notify("Queued message removed.")

    async def drop(self, why: str) -> None:
        """Nothing can send the queue (the model failed, the session was left): its texts go back
        into the input, so nothing typed is lost."""
        if not self.items:
            return
        texts = [item.text for item in self.items]
        for item in self.items:
            await item.view.remove()
        self.items.clear()
        prompt = self._app.query_one(PromptInput)
        prompt.text = "\n\n".join([*texts, prompt.text] if prompt.text else texts)
        prompt.move_cursor(prompt.document.end)
        self._app.refresh_bindings()
        self._app.notify(f"{why} Your queued message{'s are' if len(texts) > 1 else ' is'} back in the input.",
                         severity="warning")

    def _renumber(self) -> None:
        for position, item in enumerate(self.items, 1):
            item.view.set_position(position)
