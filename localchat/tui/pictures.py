"""Finished blocks of a streaming reply shown as pictures of themselves: one widget each.

Textual lays out every displayed widget near the screen on each frame that grows the reply, and
a finished table or list is many widgets (a 4-row table ~17, a 4-item list ~21): with a few of
them in view a many-block frame cost ~100 ms of UI time, most of it laying out and painting
blocks that no longer change. So once a finished block has been laid out and painted wholly in
view, its lines as the screen shows them (each of its widgets' lines, front to back, as Textual's
compositor joins them) become one ``Picture`` of the same size and margins, mounted in its
place, and the block is hidden. Nothing moves and every cell stays what it was.

Everything comes back (``restore``) with the rest of the stream's folding (``scrolled_away``):
when the reply ends, when the log is scrolled up or resized, when a message is selected, and
when the mouse presses on a picture (``Picture.Pressed``: links, selection and scrolling need
the real widgets).

This reads Textual's compositor (``Screen._compositor``: which widgets are visible where, in
paint order; Textual 8).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from textual import events
from textual.await_remove import AwaitRemove
from textual.dom import NoScreen
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

# A block of fewer widgets than this costs no more to lay out than its picture would.
MIN_WIDGETS = 3


class Picture(Widget):
    """The painted lines of a hidden block, ``original``, in its place."""

    DEFAULT_CSS = "Picture { padding: 0; border: none; }"

    class Pressed(Message):
        """The mouse pressed on a picture: the real widgets must come back."""

    def __init__(self, strips: list[Strip], original: Widget) -> None:
        super().__init__()
        self._strips = strips
        self.original = original
        width = strips[0].cell_length if strips else 0
        self.styles.width = width
        self.styles.height = len(strips)
        self.styles.margin = original.styles.margin

    def render_lines(self, crop: Region) -> list[Strip]:
        # The strips are the finished screen lines: no styles, background or padding to add.
        blank = Strip.blank(crop.width)
        lines = self._strips[crop.y:crop.bottom]
        lines = [line.crop(crop.x, crop.right) for line in lines]
        return lines + [blank] * (crop.height - len(lines))

    def on_mouse_down(self, event: events.MouseDown) -> None:
        self.post_message(self.Pressed())


def picture_of(block: Widget) -> list[Strip] | None:
    """``block``'s lines as the screen last composed them, or None unless all of it is in view.
    Only the block's own widgets are drawn (a toast or a menu above it is not part of it)."""
    try:
        compositor = block.screen._compositor
    except NoScreen:  # removed meanwhile
        return None
    visible = compositor.visible_widgets  # front to back
    if block not in visible:
        return None
    region, clip = visible[block]
    if not region or not clip.contains_region(region) or not compositor.size.region.contains_region(region):
        return None
    own = set(block.walk_children(with_self=True))
    # Per screen row: the spans of the block not painted yet, and the pieces painted so far.
    gaps: list[list[tuple[int, int]]] = [[(region.x, region.right)] for _ in range(region.height)]
    pieces: list[list[tuple[int, Strip]]] = [[] for _ in range(region.height)]
    for widget, (w_region, w_clip) in visible.items():
        if widget not in own:
            continue
        shown = w_region.intersection(w_clip).intersection(region)
        if not shown:
            continue
        strips = widget.render_lines(Region(shown.x - w_region.x, shown.y - w_region.y,
                                            shown.width, shown.height))
        for y, strip in zip(shown.line_range, strips):
            row = y - region.y
            gaps[row] = list(_paint(gaps[row], pieces[row], shown.x, strip))
    if any(gaps):
        return None  # some cells were not painted by the block: not a picture of it alone
    lines = []
    for painted in pieces:
        painted.sort(key=lambda piece: piece[0])
        lines.append(Strip.join(strip for _, strip in painted).discard_meta())
    return lines


def _paint(gaps: list[tuple[int, int]], pieces: list[tuple[int, Strip]], x: int,
           strip: Strip) -> Iterable[tuple[int, int]]:
    """Paint ``strip`` (starting at screen column ``x``) into the ``gaps`` of a row: the parts
    that fall in a gap become pieces; yields the gaps left."""
    end = x + strip.cell_length
    for start, stop in gaps:
        lo, hi = max(start, x), min(stop, end)
        if lo >= hi:
            yield start, stop
            continue
        pieces.append((lo, strip.crop(lo - x, hi - x)))
        if start < lo:
            yield start, lo
        if hi < stop:
            yield hi, stop


class Pictures:
    """The finished blocks of ``container`` shown as pictures (none at first)."""

    def __init__(self, container: Widget, can_picture: Callable[[Widget], bool]) -> None:
        self._container = container
        self._can_picture = can_picture
        self._ready: set[Widget] = set()  # finished at the last ``take``: laid out since
        self.shown: list[Picture] = []
        self.width: int | None = None  # the container's width when the pictures were taken

    def __repr__(self) -> str:
        return f"<Pictures {len(self.shown)} in {self._container!r}>"

    async def take(self) -> int:
        """Picture the finished blocks that were finished at the last call (so laid out and
        painted since) and are wholly in view; returns how many were pictured now."""
        candidates = [child for child in self._container.children
                      if child.display and not isinstance(child, Picture) and self._can_picture(child)]
        ready, self._ready = self._ready, set(candidates)
        taken: list[tuple[Widget, Picture]] = []
        for block in candidates:
            if block not in ready or _widgets(block) < MIN_WIDGETS:
                continue
            strips = picture_of(block)
            if strips:
                taken.append((block, Picture(strips, block)))
        if not taken:
            return 0
        self.width = self._container.size.width
        with self._container.app.batch_update():
            for block, picture in taken:
                await self._container.mount(picture, before=block)
                block.display = False
                self._ready.discard(block)
        self.shown += [picture for _, picture in taken]
        return len(taken)

    def restore(self) -> AwaitRemove | None:
        """Show the real blocks again, in one layout, and remove the pictures (awaiting the
        result waits for their removal)."""
        pictures, self.shown, self.width = self.shown, [], None
        for picture in pictures:
            picture.original.display = True
            picture.display = False
        return self._container.remove_children(pictures) if pictures else None

    async def clear(self) -> None:
        """Restore, and wait until the pictures are gone."""
        removal = self.restore()
        self._ready.clear()
        if removal is not None:
            await removal


def _widgets(block: Widget) -> int:
    return 1 + sum(1 for _ in block.walk_children())
