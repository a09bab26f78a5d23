"""Type-ahead: a message sent while the model loads or a reply streams waits in a queue, shown
under the conversation as queued, and goes out as soon as the engine is free. Esc removes the
newest queued message (before it stops a reply).

Queued messages belong to the session they were typed in: leaving it puts their text back into
the input rather than sending it to another conversation or dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.store.export import image_line
from localchat.tui.chat_log import QueuedPrompt

if TYPE_CHECKING:
    from localchat.store.images import ImageFile
    from localchat.tui.host import Host


@dataclass
class Queued:
    text: str
    route: str
    view: QueuedPrompt
    images: tuple[ImageFile, ...] = ()  # its pictures (a message taken back leaves them out)


class TypeAhead:
    """The queue of messages waiting for the engine, oldest first, each shown under the log.
    When one waits and when the oldest goes is the turns' call (``Turns.send``)."""

    def __init__(self, host: Host) -> None:
        self._host = host
        self.items: list[Queued] = []

    async def add(self, text: str, route: str, images: tuple[ImageFile, ...] = ()) -> None:
        shown = "\n".join([*(image_line(i.ref) for i in images), text])
        view = await self._host.chat_log.add_queued(shown, len(self.items) + 1)
        self.items.append(Queued(text, route, view, images))
        self._host.refresh_bindings()  # Esc now removes a queued message

    async def take_oldest(self) -> Queued:
        """The oldest queued message, off the queue and the screen, to be sent now."""
        item = self.items.pop(0)
        await item.view.remove()
        self._renumber()
        return item

    async def remove_last(self) -> None:
        """Esc: take back the newest queued message (its text returns to an empty input)."""
        item = self.items.pop()
        await item.view.remove()
        prompt = self._host.prompt
        if not prompt.text:
            prompt.text = item.text
            prompt.move_cursor(prompt.document.end)
        self._host.refresh_bindings()
        self._host.notify("Queued message removed.")

    async def drop(self, why: str) -> None:
        """Nothing can send the queue (the model failed, the session was left): its texts go back
        into the input, so nothing typed is lost."""
        if not self.items:
            return
        texts = [item.text for item in self.items]
        for item in self.items:
            await item.view.remove()
        self.items.clear()
        prompt = self._host.prompt
        prompt.text = "\n\n".join([*texts, prompt.text] if prompt.text else texts)
        prompt.move_cursor(prompt.document.end)
        self._host.refresh_bindings()
        self._host.notify(f"{why} Your queued message{'s are' if len(texts) > 1 else ' is'} back in the input.",
                          severity="warning")

    def _renumber(self) -> None:
        for position, item in enumerate(self.items, 1):
            item.view.set_position(position)
