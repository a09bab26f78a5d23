"""The block a streaming reply is still writing, shown so that a frame costs what changed.

Textual's own Markdown widget re-parses and re-renders the last block on every append, and a
paragraph's render wraps its text from the first word: with a 2,000-token one-paragraph reply a
frame cost ~80 ms of UI time. These widgets keep that cost flat:

- ``LiveParagraph`` renders its lines once they are complete and keeps them as strips; each
  frame parses, wraps and paints only the paragraph's tail (the last line or two). A line is
  frozen only where the paragraph can be cut without changing how it renders: the head and the
  tail rendered apart give exactly the strips of the whole, and no emphasis, code span or link
  is left open in the head for a later token to close (``opens_nothing``). When the cut is not
  safe yet (a ``**`` still open, say) the tail simply grows until it is.
- ``LiveFence`` highlights a code block's complete lines once per new line, and shows the line
  being written unhighlighted after them.
- ``LiveLine`` is the raw line being written below a long list, table or quote, which are
  rebuilt only when a line completes.

When the block ends, each becomes what a one-shot render would have made (``settle``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from rich.segment import Segment
from textual.content import Content
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.visual import Visual
from textual.widgets import Label, Static
from textual.widgets._markdown import Markdown, MarkdownBlock, MarkdownFence, MarkdownParagraph

from localchat.tui.laid_out_once import LaidOutOnce

# Closers a later token could bring: if adding one changes how the head renders, the head still
# has an opener (emphasis, strike, code span, link, inline HTML) and is not cut there yet.
PROBES = ("x*", "x**", "x***", "x_", "x__", "x___", "x~", "x~~", "x`", "x``", "x```",
          "x](u)", "x]", 'x">', "x'>", "x>")
# Characters without which inline Markdown has nothing to open: plain heads skip the probes.
_OPENERS = re.compile(r"[*_~`\[\]<>!&\\]")
_WORD = re.compile(r"\S+")


@dataclass
class StreamWork:
    """What the live view of one reply did, counted (the proof tests assert on these): characters
    handed to the Markdown parser, block-level and inline; blocks built as finished widgets;
    lines rendered to strips; and per frame (characters fed, parsed, lines rendered). Work done
    while Textual lays a frame out counts towards the next frame."""

    block_chars: int = 0
    inline_chars: int = 0
    blocks_built: int = 0
    lines_rendered: int = 0
    frozen_lines: int = 0
    per_frame: list[tuple[int, int, int]] = field(default_factory=list)
    _frame_chars: int = 0
    _frame_lines: int = 0

    def parsed(self, chars: int, inline: bool = False) -> None:
        if inline:
            self.inline_chars += chars
        else:
            self.block_chars += chars
        self._frame_chars += chars

    def rendered(self, lines: int) -> None:
        self.lines_rendered += lines
        self._frame_lines += lines

    def end_frame(self, fed: int) -> None:
        self.per_frame.append((fed, self._frame_chars, self._frame_lines))
        self._frame_chars = self._frame_lines = 0


def _same(a: list[Strip], b: list[Strip]) -> bool:
    """Strips equal as painted (a link's random id aside)."""
    if len(a) != len(b):
        return False
    return all(_key(x) == _key(y) for x, y in zip(a, b))


def _key(strip: Strip) -> list[tuple[str, object]]:
    return [(s.text, s.style.clear_meta_and_links() if s.style else None) for s in strip if isinstance(s, Segment)]


def inline_content(parser: MarkdownIt, block: MarkdownBlock, source: str) -> Content:
    """``source`` parsed as a paragraph's inline text and styled as Textual's Markdown does."""
    tokens = parser.parseInline(source) if source else []
    return block._token_to_content(tokens[0]) if tokens else Content("")


def opens_nothing(head: str, render) -> bool:
    """True if no later text can change how ``head`` (the start of a paragraph, ending before a
    word) renders: nothing in it waits for a closer. ``render(source) -> Content``."""
    if not _OPENERS.search(head):
        return True
    shown = render(head.rstrip())
    for probe in PROBES:
        probed = render(head + probe)
        if not probed.plain.startswith(shown.plain):
            return False
        cut = len(shown.plain)
        if [s for s in probed.spans if s.start < cut] != list(shown.spans):
            return False
    return True


class LiveParagraph(LaidOutOnce, MarkdownParagraph):
    """A top-level paragraph still being written: complete lines frozen, the tail re-rendered.

    ``slack`` blank rows are kept below the text, so that the paragraph (and with it the reply
    and the log's scroll position) changes size once every ``slack + 1`` lines: a frame that
    resizes costs several times one that repaints a line (see ``tui/pacing.py``)."""

    def __init__(self, markdown: Markdown, token, parser: MarkdownIt, work: StreamWork,
                 slack: int = 0) -> None:
        super().__init__(markdown, token)
        self._parser = parser
        self._work = work
        self.slack = slack
        self._rows = 0  # the height laid out: the text's lines and the slack below them
        self.live = True
        self._text = ""  # the paragraph's source so far, from its first character
        self._frozen_at = 0  # _text[:_frozen_at] is rendered in _frozen
        self._frozen: list[Strip] = []
        self._tail: list[Strip] = []
        self._width = 0
        self._stale = True  # _tail does not show _text yet
        self._try_freeze_at = 2  # tail lines at which to look for a cut again

    def __repr__(self) -> str:
        return f"<LiveParagraph {len(self._frozen)} frozen + {len(self._tail)} lines, {len(self._text)} chars>"

    @property
    def frozen_lines(self) -> int:
        return len(self._frozen)

    def show(self, text: str) -> None:
        """The paragraph's source is now ``text`` (which extends what it was)."""
        if not text.startswith(self._text[:self._frozen_at]):
            self._frozen, self._frozen_at = [], 0
        self._text = text
        self._stale = True
        if not self._width:
            self.refresh(layout=True)
            return
        frozen_before = len(self._frozen)
        self._render_tail()
        lines = len(self._frozen) + len(self._tail)
        if not self._rows - self.slack <= lines <= self._rows:
            self._rows = lines + self.slack
            self.refresh(layout=True)
        else:  # only the tail's rows repaint; nothing moves
            first = min(frozen_before, len(self._frozen))
            self.refresh(Region(0, first, self._width, max(1, lines - first)))

    def settle(self, token) -> None:
        """The paragraph is complete: render it whole, as a one-shot Markdown render would."""
        self.live = False
        self._frozen, self._tail = [], []
        self.build_from_token(token)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if not self.live:
            return super().get_content_height(container, viewport, width)
        if width != self._width:  # first layout or a resize: wrap again from the start
            self._width = width
            self._frozen, self._frozen_at = [], 0
            self._stale = True
        if self._stale:
            self._render_tail()
        lines = len(self._frozen) + len(self._tail)
        if not self._rows - self.slack <= lines <= self._rows:
            self._rows = lines + self.slack
        return max(1, self._rows)

    def render_line(self, y: int) -> Strip:
        if not self.live:
            return super().render_line(y)
        if self._stale and self._width:
            self._render_tail()
        if y < len(self._frozen):
            return self._frozen[y]
        y -= len(self._frozen)
        if y < len(self._tail):
            return self._tail[y]
        return Strip.blank(self.size.width, self.visual_style.rich_style)

    def _inline(self, source: str) -> Content:
        self._work.parsed(len(source), inline=True)
        return inline_content(self._parser, self, source)

    def _strips(self, content: Content) -> list[Strip]:
        strips = Visual.to_strips(self, content, self._width, None, self.visual_style)
        self._work.rendered(len(strips))
        return strips

    def _render_tail(self) -> None:
        self._stale = False
        tail = self._text[self._frozen_at:]
        self._tail = self._strips(self._inline(tail.rstrip()))
        if len(self._tail) >= self._try_freeze_at:
            self._freeze(tail)

    def _freeze(self, tail: str) -> None:
        """Move the tail's complete lines into the frozen strips, at the latest safe cut."""
        words = [m.start() for m in _WORD.finditer(tail)]
        shown = 0
        cuts = []
        for line in self._tail[:-1]:
            shown += len(line.text.split())
            cuts.append(shown)
        for count in reversed(cuts):
            if not 0 < count < len(words):
                continue
            cut = words[count]
            head, rest = tail[:cut], tail[cut:]
            if not opens_nothing(head, self._inline):
                continue
            head_strips = self._strips(self._inline(head.rstrip()))
            rest_strips = self._strips(self._inline(rest.rstrip()))
            if _same(head_strips + rest_strips, self._tail):
                self._frozen += head_strips
                self._work.frozen_lines += len(head_strips)
                self._frozen_at += cut
                self._tail = rest_strips
                self._try_freeze_at = 2
                return
        self._try_freeze_at = len(self._tail) + 1  # no safe cut yet: look again a line later


class LiveFence(LaidOutOnce, MarkdownFence):
    """A code block still being written: complete lines highlighted (again when a line is
    added), the line being written shown plain after them, ``slack`` blank rows kept below
    (as ``LiveParagraph`` does)."""

    def __init__(self, markdown: Markdown, token, work: StreamWork, slack: int = 0) -> None:
        super().__init__(markdown, token, "")
        self._work = work
        self.slack = slack
        self.live = True
        self._complete = ""  # code lines highlighted so far (each ending in a newline)
        self._lines = 0
        self._rows = 0

    def __repr__(self) -> str:
        return f"<LiveFence {self.lexer or 'text'} {self._lines} lines>"

    def set_lexer(self, lexer: str) -> None:
        """The language named on the opening line (which may have been incomplete before)."""
        if lexer != self.lexer:
            self.lexer = lexer
            self._complete = ""  # highlight again

    def show(self, code: str) -> None:
        """The code so far (the fence's body; its last line may be incomplete)."""
        cut = code.rfind("\n") + 1
        complete, partial = code[:cut], code[cut:]
        if complete != self._complete:
            self._complete = complete
            self._work.parsed(len(complete))
            self._highlighted_code = self.highlight(complete.rstrip("\n"), self.lexer,
                                                    ansi=self.app.native_ansi_color,
                                                    dark=self.app.current_theme.dark)
        body = self._highlighted_code
        if partial:
            body = (body + "\n" + partial) if complete else Content(partial)
        lines = complete.count("\n") + bool(partial)
        self._work.rendered(lines)
        self._lines = lines
        grew = not self._rows - self.slack <= lines <= self._rows
        if grew:
            self._rows = lines + self.slack
        if self._rows > max(1, lines):
            body = body + "\n" * (self._rows - max(1, lines))
        self.code = code
        self._content = body
        label = self.query("#code-content")
        if label:
            label.first(Label).update(body, layout=grew)

    def compose(self):
        yield Label(self._content, id="code-content", expand=True)

    async def settle(self, block: MarkdownFence) -> None:
        """The fence is complete: take the one-shot render's highlighting."""
        self.live = False
        await self._update_from_block(block)


class LiveLine(LaidOutOnce, Static):
    """The raw line being written below a long open block (a list, a table), until it ends."""

    DEFAULT_CSS = "LiveLine { height: auto; margin: 0 0 1 0; }"

    def __init__(self) -> None:
        super().__init__("", markup=False)
        self.text = ""

    def show(self, text: str) -> None:
        if text != self.text:
            grew = text.count("\n") != self.text.count("\n") or not self.text or not text
            self.text = text
            self.display = bool(text)
            self.update(text, layout=grew)
