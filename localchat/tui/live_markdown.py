"""A reply's Markdown body, which grows as the reply streams and lays out only what changed.

The reply so far is split where its last top-level block starts (as markdown-it sees it). The
blocks before that are finished: each is built once as the widgets a one-shot render makes and
never parsed again. The last block is open and shown by a live widget (``live_blocks``): a
paragraph keeps its complete lines as strips and re-renders only its tail, a code block adds
lines, a short list or table is rebuilt (a long one only when a line completes, the line being
written shown raw below it). A frame that adds text within a line parses nothing but that tail:
a new block can only start after a newline, or at the start of a line still short enough to
become one (``SHORT_LINE``).

``finish`` builds the open block's final widgets, so the screen ends as
``Markdown.update(reply)`` would have drawn it; a reply that is not the streamed text (or that
defines link references, which reach back into blocks already built) gets that one-shot render.

This leans on Textual's Markdown internals (``_parse_markdown``, ``_markdown``; Textual 8).
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.token import Token
from textual import events
from textual.widget import Widget
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownBlock, MarkdownFence, MarkdownTable

from localchat.tui.laid_out_once import LaidOutOnce
from localchat.tui.live_blocks import LiveFence, LiveLine, LiveParagraph, StreamWork
from localchat.tui.live_update import update_from_tokens
from localchat.tui.pictures import Pictures
from localchat.tui.scrolled_away import ScrolledAway

# A line shorter than this may still turn out to start a block ("- ", "1. ", "```", "|---|"):
# until it is this long the open block is parsed again on each frame.
SHORT_LINE = 120
# An open list, table or quote longer than this follows only its complete lines.
REBUILD_LIMIT = 1500
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:", re.MULTILINE)


def top_level_starts(tokens: list[Token]) -> list[tuple[int, int]]:
    """(token index, first source line) of each top-level block in markdown-it's ``tokens``."""
    return [(i, t.map[0]) for i, t in enumerate(tokens) if t.level == 0 and t.map is not None]


class LiveMarkdown(LaidOutOnce, Markdown):
    """Textual's Markdown widget, fed a streaming reply with ``feed`` and ended by ``finish``."""

    def __init__(self, markdown: str | None = None) -> None:
        super().__init__(markdown)
        self._parser = MarkdownIt("gfm-like")
        self.work = StreamWork()
        self.slack_rows = 0  # blank rows an open paragraph or code block keeps below its text
        self._away = ScrolledAway(self, can_fold=lambda widget: widget not in self._live)
        self._pictures = Pictures(self, can_picture=lambda widget: widget not in self._live)
        self._reset_stream()

    def _reset_stream(self) -> None:
        self._streamed = False
        self._open_at = 0  # offset in the source where the open block starts
        self._open_line = 0  # its first line in the source
        self._live: list[Widget] = []  # the widgets showing the open block
        self._live_line: LiveLine | None = None
        self._built_from = ""  # the source a rebuilt open block was built from

    async def feed(self, fragment: str) -> None:
        """Add ``fragment`` to the reply and show it (one call per frame)."""
        if not fragment:
            return
        self._streamed = True
        self._markdown += fragment
        open_src = self._markdown[self._open_at:]
        if not self._extend(fragment, open_src):
            async with self.lock:
                await self._restructure(open_src)
        self.work.end_frame(len(fragment))

    async def fold_scrolled_away(self, above_y: int, at_least: int, pictures: bool = True) -> None:
        """Hide the finished blocks that end above screen row ``above_y`` (``ScrolledAway``),
        and (with ``pictures``) show those wholly in view as pictures of themselves
        (``Pictures``)."""
        await self._away.fold(above_y, at_least)
        if pictures:
            await self._pictures.take()

    def on_resize(self, event: events.Resize) -> None:
        if self._pictures.width is not None and event.size.width != self._pictures.width:
            self._pictures.restore()  # a picture keeps the width it was taken at

    def unfold(self) -> None:
        """The real widgets of every block, laid out on the next refresh."""
        self._away.unfold()
        self._pictures.restore()

    async def _unfold_now(self) -> None:
        """``unfold``, and wait until the pictures are gone (the children are final after)."""
        self._away.unfold()
        await self._pictures.clear()

    async def finish(self, text: str) -> None:
        """The reply is complete: draw ``text`` as a one-shot render would."""
        await self._unfold_now()
        if not self._streamed or text != self._markdown or _REFERENCE.search(text):
            await self._drop_live()
            await self.update(text)
            return
        async with self.lock:
            tokens = self._parse(self._markdown[self._open_at:])
            await self._settle(tokens, self._open_line)
        self._reset_stream()

    async def reset(self) -> None:
        """Empty the body (a reply handed to another model starts again)."""
        await self._unfold_now()
        await self._drop_live()
        await self.update("")

    # --- frames -------------------------------------------------------------------------

    def _extend(self, fragment: str, open_src: str) -> bool:
        """Show the new text without parsing the block again, where nothing can have started."""
        if "\n" in fragment or not self._live:
            return False
        partial = open_src[open_src.rfind("\n") + 1:]
        live = self._live[0]
        if isinstance(live, LiveParagraph) and live.live and len(partial) >= SHORT_LINE:
            live.show(open_src.strip())
            return True
        if isinstance(live, LiveFence) and live.live and not partial.lstrip().startswith(("`", "~")):
            live.show(_fence_body(open_src))
            return True
        if self._live_line is not None and len(open_src) > REBUILD_LIMIT and len(partial) >= SHORT_LINE:
            self._live_line.show(partial)
            return True
        return False

    async def _restructure(self, open_src: str) -> None:
        tokens = self._parse(open_src)
        starts = top_level_starts(tokens)
        if len(starts) > 1:  # blocks before the last one are finished
            index, line = starts[-1]
            settled = "".join(open_src.splitlines(keepends=True)[:line])
            await self._settle(tokens[:index], self._open_line)
            self._open_at += len(settled)
            self._open_line += line
            open_src = open_src[len(settled):]
            tokens = _shift(tokens[index:], -line)
        if starts:
            await self._show_open(tokens, open_src)

    async def _show_open(self, tokens: list[Token], open_src: str) -> None:
        first = tokens[0]
        live = self._live[0] if self._live else None
        if first.type == "paragraph_open":
            if not isinstance(live, LiveParagraph):
                live = LiveParagraph(self, first, self._parser, self.work, self.slack_rows)
                await self._replace_live([live])
            live.show(open_src.strip())
        elif first.type == "fence":
            if not isinstance(live, LiveFence):
                live = LiveFence(self, first, self.work, self.slack_rows)
                await self._replace_live([live])
            live.set_lexer(first.info)
            live.show(_fence_body(open_src))
        else:
            await self._rebuild_open(open_src, tokens)

    async def _rebuild_open(self, open_src: str, tokens: list[Token]) -> None:
        """A list, table, quote or heading, from its source: updated in place where it can be
        (``live_update``), else built again. A long one follows its complete lines only, when
        one is added, with the line being written shown raw below it."""
        cut = open_src.rfind("\n") + 1 if len(open_src) > REBUILD_LIMIT else len(open_src)
        source, partial = open_src[:cut], open_src[cut:]
        line = self._live_line or LiveLine()
        if source != self._built_from or self._live_line is None:
            self._built_from = source
            if cut < len(open_src):
                tokens = self._parse(source) if source.strip() else []
            shown = [w for w in self._live if w is not line]

            def build() -> list[MarkdownBlock]:
                return self._blocks(tokens, self._open_line)

            if len(shown) == 1 and await update_from_tokens(shown[0], tokens, build):
                self._live = [*shown, line]
            else:
                await self._replace_live([*build(), line])
            self._live_line = line
        line.show(partial)

    # --- building widgets ---------------------------------------------------------------

    def _parse(self, source: str) -> list[Token]:
        self.work.parsed(len(source))
        return self._parser.parse(source)

    def _blocks(self, tokens: list[Token], first_line: int) -> list[MarkdownBlock]:
        blocks = list(self._parse_markdown(tokens))
        for block in blocks:
            start, end = block.source_range
            block.source_range = (start + first_line, end + first_line)
        return blocks

    async def _settle(self, tokens: list[Token], first_line: int) -> None:
        """Finished blocks (the open one first): its live widget takes the final render (a list
        or table one last update in place), the others are built and mounted before the next
        open block."""
        starts = top_level_starts(tokens)
        cut = starts[1][0] if len(starts) > 1 else len(tokens)
        first, rest = tokens[:cut], tokens[cut:]
        live = self._live[0] if self._live else None
        kept: list[Widget] = []
        blocks: list[MarkdownBlock] = []
        if first and isinstance(live, LiveParagraph) and first[0].type == "paragraph_open" and len(first) > 1:
            live.settle(first[1])
            kept = [live]
        elif first and isinstance(live, LiveFence) and first[0].type == "fence":
            fence = self._blocks(first, first_line)[0]
            assert isinstance(fence, MarkdownFence)
            await live.settle(fence)
            kept = [live]
        elif first and live is not None and not isinstance(live, (LiveParagraph, LiveFence, MarkdownTable)):
            # (A table is built again: the lines of a grid updated in place can keep the column
            # widths of an earlier layout.)
            def build() -> list[MarkdownBlock]:
                return self._blocks(first, first_line)

            if await update_from_tokens(live, first, build):
                kept = [live]
        if not kept:
            blocks = self._blocks(first, first_line)
        blocks += self._blocks(rest, first_line)
        self.work.blocks_built += len(blocks)
        stale = [w for w in self._live if w not in kept]
        self._live, self._live_line, self._built_from = [], None, ""
        with self.app.batch_update():
            if stale:
                await self.remove_children(stale)
            if blocks:
                await self.mount_all(blocks)

    async def _replace_live(self, widgets: list[Widget]) -> None:
        """The open block is now shown by ``widgets`` (those already mounted stay in place)."""
        old = [w for w in self._live if w not in widgets]
        self._live = widgets
        with self.app.batch_update():
            if old:
                await self.remove_children(old)
            pending: list[Widget] = []
            for widget in widgets:
                if widget.parent is not self:
                    pending.append(widget)
                elif pending:
                    await self.mount_all(pending, before=widget)
                    pending = []
            if pending:
                await self.mount_all(pending)

    async def _drop_live(self) -> None:
        live = [w for w in self._live if w.parent is self]
        self._reset_stream()
        if live:
            await self.remove_children(live)


def _fence_body(open_src: str) -> str:
    """The code of an open fence: everything after its opening line."""
    return open_src[open_src.find("\n") + 1:] if "\n" in open_src else ""


def _shift(tokens: list[Token], lines: int) -> list[Token]:
    for token in tokens:
        if token.map is not None:
            token.map = [token.map[0] + lines, token.map[1] + lines]
    return tokens
