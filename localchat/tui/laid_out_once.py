"""Widgets whose new size needs no second layout: a growing reply is laid out once a frame.

After a layout Textual tells each widget its new size (``Widget._size_updated``), and a widget
whose virtual (content) size changed sets the ``virtual_size`` reactive, which asks for another
layout of the screen. So each frame that grew a streaming reply was laid out twice: the log,
the reply, its body and the growing paragraph all report a new size. For these widgets that
size is what the layout just done gave them, and a scrollbar that must appear or go asks for its
own layout (``show_vertical_scrollbar`` is a layout reactive too), so the second layout changed
nothing. Measured (``bench --tui``'s scripted one-paragraph reply, headless, 2 cores, two runs
each): 70 layouts in ~245 frames before, 43 in ~280 after; frame interval p50 106 → 90 ms, p90
150 → 135 ms, for the same share of the CPU.

This overrides a private method of Textual 8's ``Widget``; ``tests/test_tui_stream.py`` counts
the layouts of a growing reply, so a Textual that changes it fails there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.geometry import Size

if TYPE_CHECKING:
    from textual.widget import Widget as _Mixin
else:
    # A plain mixin: Textual finds a widget's CSS type names (and its DEFAULT_CSS) through its
    # first base that is a widget class, which must stay the Textual class it extends.
    _Mixin = object


class LaidOutOnce(_Mixin):
    """Mixed in before a Textual widget class: its size updates ask for no further layout."""

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size,
                      layout: bool = True) -> bool:
        return super()._size_updated(size, virtual_size, container_size, layout=False)
