"""Whether the conversation previews pictures, and which terminal graphics protocol draws them.

``LOCALCHAT_IMAGE_PREVIEW`` decides: ``auto`` (the default) asks the terminal whether it draws
sixel or kitty graphics (textual-image's own queries), ``kitty`` or ``sixel`` trust the user
without asking, ``off`` (or anything else) shows only the ``[image: …]`` line.

The terminal can only be asked before Textual starts (its input thread would take the answer),
and only where stdin and stdout are the terminal, so ``prepare_previews`` asks once at launch.
Nothing asks at import time, and an app that was never prepared (tests, the bench driving the
app) treats ``auto`` as ``off``: no query, no bytes written outside Textual's own output.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

from localchat.terminal import shows_styles

log = logging.getLogger(__name__)

PREVIEW_SETTING = "LOCALCHAT_IMAGE_PREVIEW"

Renderer = Literal["kitty", "sixel"]

_prepared: list[Renderer | None] = []  # what ``prepare_previews`` decided, once it ran


def prepare_previews() -> Renderer | None:
    """Decide, before the app takes the terminal, how pictures are previewed (asking the
    terminal when the setting is ``auto``). Returns the renderer; None: no previews."""
    renderer = _decide(may_ask=True)
    if renderer is not None and not _load_widgets():
        renderer = None
    _prepared[:] = [renderer]
    return renderer


def preview_renderer() -> Renderer | None:
    """How pictures are previewed: what ``prepare_previews`` decided, else the setting alone
    (``auto`` then means none: the terminal can no longer be asked)."""
    return _prepared[0] if _prepared else _decide(may_ask=False)


def _decide(*, may_ask: bool) -> Renderer | None:
    setting = os.environ.get(PREVIEW_SETTING, "auto").strip().lower() or "auto"
    if setting == "auto":
        return _ask_terminal() if may_ask and _on_a_terminal() else None
    if setting == "sixel":  # drawn through Textual's own output, wherever that goes
        return "sixel"
    if setting == "kitty":
        # textual-image writes kitty pictures straight to stdout, beside Textual's output: into a
        # pipe or a file they would be garbage.
        return "kitty" if _is_tty(sys.__stdout__) else None
    if setting != "off":
        log.warning("%s=%s: expected off, auto, kitty or sixel; pictures are not previewed",
                    PREVIEW_SETTING, setting)
    return None


def _on_a_terminal() -> bool:
    """textual-image asks through stdout and reads the answer from stdin: both must be a
    terminal, and not one that says it shows no styles (``TERM=dumb``)."""
    return sys.__stdout__ is not None and shows_styles(sys.__stdout__) and _is_tty(sys.__stdin__)


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream is not None and stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):  # a closed or replaced stream
        return False


def _load_widgets() -> bool:
    """Import textual-image's widgets now: at import it measures the terminal's cells (an ioctl,
    else a query), which it cannot do once Textual reads the input."""
    try:
        import textual_image.widget  # noqa: F401
    except Exception:
        log.warning("textual-image could not measure the terminal", exc_info=True)
        return False
    return True


def _ask_terminal() -> Renderer | None:
    """The protocol textual-image found: it asks at import (sixel first, then kitty's graphics
    protocol, 0.1 s each at most) and falls back to half blocks or unicode, which we leave out:
    a blocky preview says no more than the line naming the picture."""
    try:
        from textual_image import renderable
        from textual_image.renderable.sixel import Image as SixelRenderable
        from textual_image.renderable.tgp import Image as KittyRenderable
    except Exception:  # a terminal that answers oddly must not stop the app from starting
        log.warning("asking the terminal for graphics support failed", exc_info=True)
        return None
    if renderable.Image is SixelRenderable:
        return "sixel"
    if renderable.Image is KittyRenderable:
        return "kitty"
    return None
