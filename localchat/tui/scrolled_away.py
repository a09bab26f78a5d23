"""Widgets scrolled far above a log that follows a stream, set aside while it streams.

Textual lays out every displayed widget whenever any one changes size, and a growing reply
changes size every few lines: with a many-block reply (each list item, table cell and code
block a widget or several) or a long conversation above it, a frame that grows the reply cost
over 100 ms after 2,000 tokens. Hiding (``display: none``) the widgets that scrolled at least a
screen above the view, and putting one spacer of their height in their place, keeps the layout
to what is near the screen, so that cost stays flat. The geometry does not change: the spacer
ends exactly where the first kept widget's top margin begins (margins between siblings collapse
to the larger one, and the spacer has none), so nothing moves and the scrollbar stays true.

Everything comes back (``unfold``) before the user could see the difference: when the log is
scrolled up or resized, or when a message is selected. Between replies the messages stay folded
(``ChatLog.fold_history``): a mount lays out every displayed widget, so with the whole
conversation shown, sending a prompt below 50 stored turns cost ~250 ms of layout before its
first token could show, and so did the end of each reply.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.widget import Widget


class Spacer(Widget):
    """Blank rows standing in for hidden widgets."""

    DEFAULT_CSS = "Spacer { height: 0; margin: 0; padding: 0; }"


class ScrolledAway:
    """The leading children of ``container`` hidden behind a spacer (none at first)."""

    def __init__(self, container: Widget, can_fold: Callable[[Widget], bool] = lambda w: True) -> None:
        self._container = container
        self._can_fold = can_fold
        self._spacer: Spacer | None = None
        self.hidden: list[Widget] = []

    def __repr__(self) -> str:
        return f"<ScrolledAway {len(self.hidden)} hidden in {self._container!r}>"

    async def fold(self, above_y: int, at_least: int = 1) -> int:
        """Hide the children that end above screen row ``above_y`` (if ``at_least`` rows of
        them do); returns how many were hidden now."""
        children = [c for c in self._container.children if c is not self._spacer and c.display]
        run: list[Widget] = []
        for child in children:
            if not self._can_fold(child) or child.region.bottom > above_y:
                break
            run.append(child)
        kept = children[len(run)] if len(run) < len(children) else None
        if not run or kept is None:
            return 0
        first = run[0]
        top = self._spacer.region.y if self._spacer is not None else first.region.y - first.styles.margin.top
        height = kept.region.y - kept.styles.margin.top - top
        if height < at_least:
            return 0
        if self._spacer is None:
            self._spacer = Spacer()
            await self._container.mount(self._spacer, before=first)
        for widget in run:
            widget.display = False
        self.hidden += run
        self._spacer.styles.height = height
        return len(run)

    def unfold(self) -> None:
        """Show everything again (laid out on the next refresh)."""
        for widget in self.hidden:
            widget.display = True
        self.hidden = []
        if self._spacer is not None:
            self._spacer.styles.height = 0

    def forget(self) -> None:
        """The container's children were replaced: nothing is hidden any more."""
        self.hidden = []
        self._spacer = None
