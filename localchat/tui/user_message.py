"""A prompt in the chat log as the user sent it: a line naming each of its pictures,
``[image: cat.png 640x480]``, with a small preview under it where the terminal draws pictures
(``image_previews``), then its text, shown literally (not as Markdown). When an edit or a /retry
forked the conversation here, a last line says which version is on screen."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from localchat.store.export import image_line
from localchat.store.records import ImageRef
from localchat.tui.graphics_support import preview_renderer
from localchat.tui.image_previews import ImagePreview

# A picture's bytes: the attached file's for a prompt just sent, the stored copy's for one read
# back from the session. None: not to be had (the preview is left out). Called off the UI thread.
PictureBytes = Callable[[ImageRef], bytes | None]


class PictureLine(Static):
    """``[image: cat.png 640x480]``: the picture a prompt had, named."""


class PromptText(Static):
    """What the user typed (and, for a forked prompt, the line saying which version it is)."""


class UserMessage(Vertical):
    """A prompt as the user typed it, its pictures named above it. ``pictures``: where their
    bytes are, for previews (None: named only)."""

    def __init__(self, text: str, versions: tuple[int, int] | None = None,
                 seq: int | None = None, images: tuple[ImageRef, ...] = (),
                 pictures: PictureBytes | None = None) -> None:
        super().__init__()
        self.text = text
        self.images = images
        self.seq = seq  # its turn in the store; None for a prompt added live, not yet re-read
        self._pictures = pictures
        self.body = PromptText(text, markup=False)
        if versions is not None:
            self.show_versions(*versions)

    versions_label = ""

    def compose(self) -> ComposeResult:
        # Handed to the previews, not kept: a prompt just sent holds its pictures' bytes.
        pictures, self._pictures = self._pictures, None
        renderer = preview_renderer() if self.images and pictures is not None else None
        for ref in self.images:
            yield PictureLine(image_line(ref), markup=False)
            if renderer is not None and pictures is not None:
                yield ImagePreview(ref, partial(pictures, ref), renderer)
        yield self.body

    def show_versions(self, current: int, count: int) -> None:
        """Mark a forked prompt: version ``current`` (0-based) of ``count``; ←/→ switch."""
        if count > 1:
            self.versions_label = f"‹ {current + 1}/{count} ›"
            self.body.update(Text(self.text) + Text(f"\n{self.versions_label}  ←/→ on it (Alt+↑ selects)", style="dim"))
