"""A Collapsible whose title changes while it is on screen (a tool call's line says how the call
went, the Thinking block how long the model thought).

Textual's Collapsible sizes its title to the title's text (``width: auto``), and a title that grows
right after it is first laid out can keep its old width: the new text is measured, but the
title's region is not laid out again. Seen in the app: a call that returned in the frame it was
shown in kept its bare line, "✓ 1 line" cut off, in 2 runs of 15. Here the title spans the row
instead, so a new title needs a repaint only, never a new layout.
"""

from __future__ import annotations

from textual.widgets import Collapsible


class RetitledCollapsible(Collapsible):
    """``Collapsible`` whose title takes the row's width (see the module doc)."""

    DEFAULT_CSS = """
    RetitledCollapsible > CollapsibleTitle { width: 1fr; }
    """
