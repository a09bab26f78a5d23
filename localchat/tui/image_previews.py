"""A small preview of a message's picture, under its ``[image: …]`` line, where the terminal draws
sixel or kitty graphics (``graphics_support``), drawn by textual-image's widgets.

A preview is at most ``MAX_ROWS`` rows high, as wide as the picture's proportions make it (at most
``MAX_COLUMNS`` and never wider than the message). The picture is decoded and shrunk to a
thumbnail once per picture (kept by its SHA-256), off the UI thread; until then, and for good when
the picture cannot be read (a truncated file, a stored copy that is gone), the preview takes no
room and the line naming the picture is all there is. Nothing about it changes while a reply
streams below, so it is laid out once.
"""

from __future__ import annotations

import asyncio
import io
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import events
from textual.widget import Widget

from localchat.store.records import ImageRef
from localchat.tui.graphics_support import Renderer

if TYPE_CHECKING:
    from PIL.Image import Image

MAX_ROWS = 8
MAX_COLUMNS = 48
# Thumbnails fit in this box: the widest and highest preview in a HiDPI terminal's cells (20x40
# pixels); textual-image scales from it to the cells' pixels at each draw, cheap at this size.
THUMBNAIL_BOX = (MAX_COLUMNS * 20, MAX_ROWS * 40)
# Sixel is encoded on the UI thread, again each time a scroll shows another part of the preview
# (a streaming reply pushes its prompt up a row at a time): a 210x160 photo took 38 ms in 256
# colours, 11 ms in 64 (and 27 KB instead of 44 for the terminal), a difference a preview this
# small hardly shows.
SIXEL_COLOURS = 64
CACHED_THUMBNAILS = 32  # a 4:3 photo's is 0.4 MB (RGBA 427x320), a panorama's 1.2 MB at most

_thumbnails: OrderedDict[str, Image] = OrderedDict()  # by SHA-256; touched on the UI thread only


def preview_size(width_px: int, height_px: int, cell: tuple[int, int], room: int) -> tuple[int, int]:
    """(columns, rows) for a ``width_px`` x ``height_px`` picture in cells of ``cell`` pixels
    (width, height), given ``room`` columns: at most ``MAX_ROWS`` rows (fewer for a small picture,
    never enlarged past a row), keeping its proportions within ``MAX_COLUMNS`` and ``room``.
    (0, 0) when there is no room."""
    cell_width, cell_height = cell
    if min(width_px, height_px, cell_width, cell_height, room) <= 0:
        return 0, 0
    rows = min(MAX_ROWS, max(1, math.ceil(height_px / cell_height)))
    columns = max(1, round(rows * cell_height * width_px / height_px / cell_width))
    widest = min(room, MAX_COLUMNS)
    if columns > widest:  # a wide picture: as wide as there is room for, fewer rows
        columns = widest
        rows = max(1, round(columns * cell_width * height_px / width_px / cell_height))
    return columns, rows


def read_thumbnail(picture: Callable[[], bytes | None]) -> Image | None:
    """The picture ``picture()`` returns, upright and shrunk to fit ``THUMBNAIL_BOX``; None when
    there are no bytes or they do not decode. Slow on a big picture: run it off the UI thread."""
    from PIL import Image, ImageOps

    data = picture()
    if data is None:
        return None
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.draft(None, THUMBNAIL_BOX)  # a JPEG decodes at a fraction of its size
            upright = ImageOps.exif_transpose(opened)  # a phone's photo, as its viewer shows it
            upright.thumbnail(THUMBNAIL_BOX)
            return upright.convert("RGBA" if upright.has_transparency_data else "RGB")
    except Exception:  # Pillow's decoders fail in many ways (OSError, SyntaxError, struct.error...)
        return None


def _remember(sha256: str, thumbnail: Image) -> None:
    _thumbnails[sha256] = thumbnail
    _thumbnails.move_to_end(sha256)
    while len(_thumbnails) > CACHED_THUMBNAILS:
        _thumbnails.popitem(last=False)


def _drawing(renderer: Renderer, thumbnail: Image) -> Widget:
    """textual-image's widget for ``renderer``, imported only once previews are on (its import
    asks the terminal; ``graphics_support.prepare_previews`` did it before the app started)."""
    from textual_image.widget import SixelImage, SixelOptions, TGPImage

    if renderer == "kitty":
        return TGPImage(thumbnail)
    return SixelImage(thumbnail, sixel_options=SixelOptions(colors=SIXEL_COLOURS))


def _cell_pixels() -> tuple[int, int]:
    # textual-image's measure of the terminal's cells (cached by it): what it scales pictures by.
    from textual_image._terminal import get_cell_size

    cell = get_cell_size()
    return cell.width, cell.height


class ImagePreview(Widget):
    """``ref``'s picture, small, under the line naming it. ``picture`` returns its bytes (the
    attached file's, or the session's stored copy); it is called off the UI thread."""

    # As wide as the message (the room its drawing may take), as high as the drawing: no room
    # until it is ready.
    DEFAULT_CSS = """
    ImagePreview {
        width: 1fr;
        height: 0;
    }
    """

    def __init__(self, ref: ImageRef, picture: Callable[[], bytes | None], renderer: Renderer) -> None:
        super().__init__()
        self.ref = ref
        self._picture: Callable[[], bytes | None] | None = picture
        self._renderer = renderer
        self._thumbnail: Image | None = None
        self.drawing: Widget | None = None  # textual-image's widget, once the thumbnail is ready

    def __repr__(self) -> str:
        return f"ImagePreview({self.ref.label!r}, {self._renderer})"

    def on_mount(self) -> None:
        thumbnail = _thumbnails.get(self.ref.sha256)
        if thumbnail is not None:
            _thumbnails.move_to_end(self.ref.sha256)
            self.call_later(self._show, thumbnail)
        else:
            self.run_worker(self._decode(), group="image-preview", exit_on_error=False)

    async def _decode(self) -> None:
        # The bytes are let go once read: a prompt just sent holds its pictures' whole files.
        picture, self._picture = self._picture, None
        if picture is None:
            return
        thumbnail = await asyncio.to_thread(read_thumbnail, picture)
        if thumbnail is None:  # the line naming the picture stays alone
            self.remove()  # not awaited: removing this widget cancels this, its worker
            return
        _remember(self.ref.sha256, thumbnail)
        await self._show(thumbnail)

    async def _show(self, thumbnail: Image) -> None:
        self._thumbnail = thumbnail
        self.drawing = _drawing(self._renderer, thumbnail)
        self._fit()
        await self.mount(self.drawing)

    def on_resize(self, event: events.Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        """Size the drawing to the message's width (hidden while there is none yet)."""
        if self.drawing is None or self._thumbnail is None:
            return
        columns, rows = preview_size(self._thumbnail.width, self._thumbnail.height,
                                     _cell_pixels(), self.size.width)
        self.drawing.display = columns > 0
        self.styles.height = rows
        if columns > 0:
            self.drawing.styles.width = columns
            self.drawing.styles.height = rows
