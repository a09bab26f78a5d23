"""A prompt in the chat log as the user sent it: a line naming each of its pictures,
``[image: cat.png 640x480]``, then its text, shown literally (not as Markdown). When an edit or a
/retry forked the conversation here, a last line says which version is on screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from localchat.store.export import image_line
from localchat.store.records import ImageRef


class PictureLine(Static):
    """``[image: cat.png 640x480]``: the picture a prompt had, named."""


class PromptText(Static):
    """What the user typed (and, for a forked prompt, the line saying which version it is)."""


class UserMessage(Vertical):
    """A prompt as the user typed it, its pictures named above it."""

    def __init__(self, text: str, versions: tuple[int, int] | None = None,
                 seq: int | None = None, images: tuple[ImageRef, ...] = ()) -> None:
        super().__init__()
        self.text = text
        self.images = images
        self.seq = seq  # its turn in the store; None for a prompt added live, not yet re-read
        self.body = PromptText(text, markup=False)
        if versions is not None:
            self.show_versions(*versions)

    versions_label = ""

    def compose(self) -> ComposeResult:
        for ref in self.images:
            yield PictureLine(image_line(ref), markup=False)
        yield self.body

    def show_versions(self, current: int, count: int) -> None:
        """Mark a forked prompt: version ``current`` (0-based) of ``count``; ←/→ switch."""
        if count > 1:
            self.versions_label = f"‹ {current + 1}/{count} ›"
            self.body.update(Text(self.text) + Text(f"\n{self.versions_label}  ←/→ on it (Alt+↑ selects)", style="dim"))
