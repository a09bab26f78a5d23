"""The chat log: the user's prompts and the assistant's replies, rendered as Markdown.

A streaming reply is fed through Textual's ``MarkdownStream``, which appends only the new text and
merges fragments when tokens arrive faster than the screen repaints; when the reply ends it gets
one full render, so constructs that only make sense whole (a code fence closed at the very end)
come out right.
"""

from __future__ import annotations

from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from localchat.events import Timings
from localchat.store import TurnRecord


def reply_caption(model: str, timings: Timings | None, *, stopped: bool) -> str:
    """The line under a reply: who answered, how fast, by which route, and whether it was cut."""
    parts = [model or "assistant"]
    if timings is not None and timings.predicted_per_second:
        parts.append(f"{timings.predicted_n} tokens · {timings.predicted_per_second:.1f} tok/s")
    if timings is not None and timings.route and timings.route != "local":
        reason = f" ({timings.route_reason})" if timings.route_reason else ""
        parts.append(f"{timings.route}{reason}")
    if stopped:
        parts.append("■ stopped")
    return " · ".join(parts)


class UserMessage(Static):
    """A prompt as the user typed it (shown literally, not as Markdown)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False)


class ReplyView(Vertical):
    """One assistant reply: its Markdown body and a caption. Streams, then finishes once."""

    def __init__(self, text: str = "", caption: str = "", *, stopped: bool = False, finished: bool = True) -> None:
        super().__init__(classes="-stopped" if stopped else "")
        self._initial = text
        self._caption = caption
        self._stream: MarkdownStream | None = None
        self.text = text
        self.finished = finished  # False while it streams

    def compose(self):
        yield Markdown(self._initial)
        yield Static(self._caption, classes="caption", markup=False)

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    async def append(self, fragment: str) -> None:
        if self._stream is None:
            self._stream = Markdown.get_stream(self.body)
        self.text += fragment
        await self._stream.write(fragment)

    async def finish(self, reply: str, caption: str, *, stopped: bool) -> None:
        """End streaming and render ``reply`` whole; mark it if the user stopped it."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.text = reply
        await self.body.update(reply)
        self.set_class(stopped, "-stopped")
        self.query_one(".caption", Static).update(caption)
        self.finished = True

    async def fail(self, message: str) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.add_class("-failed")
        self.query_one(".caption", Static).update(f"✖ {message}")
        self.finished = True


class ChatLog(VerticalScroll):
    """The conversation, scrolled to the newest text unless the user scrolled up to read."""

    def on_mount(self) -> None:
        self.anchor()

    async def show_turns(self, turns: list[TurnRecord]) -> None:
        """Replace the log with a stored session's turns."""
        await self.remove_children()
        widgets = [
            UserMessage(t.content)
            if t.role == "user"
            else ReplyView(t.content, reply_caption(t.model, t.timings, stopped=t.stopped), stopped=t.stopped)
            for t in turns
        ]
        if widgets:
            await self.mount_all(widgets)
        self.anchor()

    async def add_prompt(self, text: str) -> ReplyView:
        """Show a sent prompt and an empty reply below it, and follow the new text."""
        reply = ReplyView(finished=False)
        await self.mount_all([UserMessage(text), reply])
        self.anchor()
        return reply

    def last_reply(self) -> ReplyView | None:
        replies = self.query(ReplyView)
        return replies.last() if replies else None

    async def remove_last_exchange(self) -> None:
        """Drop the last prompt and what follows it (``/retry``)."""
        prompts = self.query(UserMessage)
        if not prompts:
            return
        last = prompts.last()
        children = list(self.children)
        await self.remove_children(children[children.index(last):])

    async def add_notice(self, text: str) -> None:
        """A line for the user that is not part of the conversation (not saved)."""
        await self.mount(Static(text, classes="notice", markup=False))

    async def clear_notices(self) -> None:
        await self.query(".notice").remove()
