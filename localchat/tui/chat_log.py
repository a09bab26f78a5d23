"""The chat log: the user's prompts and the assistant's replies, rendered as Markdown.

A streaming reply's body is a ``LiveMarkdown``: it lays out only what each frame changed (finished
blocks are built once, the open one is extended) and ends as a one-shot render of the reply would
draw it, so constructs that only make sense whole (a code fence closed at the very end) come out
right.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from localchat.reply.reasoning import split_reply
from localchat.store import TurnRecord
from localchat.store.images import ImageFile
from localchat.tui.laid_out_once import LaidOutOnce
from localchat.tui.pictures import Picture
from localchat.tui.reply_view import ReplyView, reply_caption
from localchat.tui.scrolled_away import ScrolledAway
from localchat.tui.stored_rounds import StoredReply, group_rounds
from localchat.tui.thinking import thinking_title
from localchat.tui.user_message import PictureBytes, UserMessage

FOLD_MARGIN_ROWS = 4  # rows kept above the view while folding: a small scroll-up finds them
HISTORY_FOLD_DELAY_S = 1.0  # after a stored session is mounted: its replies' Markdown is drawn by then
# Stored messages mounted when a session opens, and again each time the user reaches the top of
# those shown. A stored message costs ~30 ms of UI time to build and lay out (its Markdown's
# widgets): mounting all of them, a 50-turn session took 3.2 s to open and a 200-turn one over
# 8 s, with the app unable to take a key meanwhile. 20 messages fill a screen several times.
HISTORY_PAGE = 20


def page_start(turns: list[TurnRecord], size: int = HISTORY_PAGE) -> int:
    """Where the last page of ``size`` of ``turns`` starts: at a prompt where it can, so that a
    reply is shown below what it answers."""
    start = max(0, len(turns) - size)
    while start > 0 and turns[start].role != "user":
        start -= 1
    return start


class EarlierMessages(Static):
    """The top line of a log whose oldest messages are not shown yet."""

    def show_count(self, count: int) -> None:
        noun = "message" if count == 1 else "messages"
        self.update(f"▲ {count} earlier {noun}: scroll up to show them")


class QueuedPrompt(Static):
    """A message waiting to be sent (type-ahead): shown dimmed, with its place in the queue."""

    def __init__(self, text: str, position: int) -> None:
        super().__init__(text, markup=False)
        self.text = text
        self.set_position(position)

    def set_position(self, position: int) -> None:
        self.border_title = f"queued #{position} · sent when the model is free · Esc removes it"


class ChatLog(LaidOutOnce, VerticalScroll):
    """The conversation, scrolled to the newest text unless the user scrolled up to read."""

    show_thinking = False  # reasoning blocks open (Ctrl+T) or folded (the default)

    def __init__(self, *children, stored_pictures: PictureBytes | None = None, **options) -> None:
        super().__init__(*children, **options)
        self._stored_pictures = stored_pictures  # a stored picture's bytes, for its preview
        self._away = ScrolledAway(self)
        self._folded_reply: ReplyView | None = None
        self._folded_width = 0
        self._earlier: list[TurnRecord] = []  # the stored turns above the first one shown
        self._forks: dict[int, tuple[int, int]] = {}
        self._earlier_line: EarlierMessages | None = None
        self._mounting_earlier = asyncio.Lock()

    def on_mount(self) -> None:
        self.anchor()

    async def fold_scrolled_away(self, streaming: ReplyView) -> None:
        """While the log follows ``streaming`` to its end: hide what scrolled more than a few
        rows above the view (``ScrolledAway``), a quarter of a screen at a time."""
        line = self._fold_line()
        if line is None:
            return
        await self._away.fold(*line)
        self._folded_reply = streaming
        # Pictures only once the scrollbar is there: its coming narrows the reply, and a picture
        # keeps the width it was taken at.
        await streaming.body.fold_scrolled_away(*line, pictures=self.show_vertical_scrollbar)

    async def fold_history(self) -> None:
        """While the log shows its end: hide the messages scrolled away above the view (see
        ``scrolled_away``), while a reply streams and between replies."""
        line = self._fold_line()
        if line is not None:
            await self._away.fold(*line)

    def _fold_line(self) -> tuple[int, int] | None:
        """While the log shows its end: the screen row above which widgets fold, and the fewest
        rows worth a fold (a quarter of a screen at a time: each fold costs a layout)."""
        if not self.is_vertical_scroll_end or not self.size.height:
            return None
        return self.region.y - FOLD_MARGIN_ROWS, max(1, self.size.height // 4)

    def unfold(self) -> None:
        """Show everything folded away again."""
        self._away.unfold()
        self.unfold_reply()

    def unfold_reply(self) -> None:
        """Show what was folded in the streaming reply (its blocks scrolled away, its pictures);
        the messages above stay folded until the user scrolls up to them."""
        if self._folded_reply is not None:
            self._folded_reply.body.unfold()
            self._folded_reply = None

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value < old_value:  # the user scrolls up: the real text must be there
            self.unfold()
            if new_value <= 0 and self._earlier:
                self.call_later(self.show_earlier)

    def on_picture_pressed(self, event: Picture.Pressed) -> None:
        # A click on a block shown as its picture (links, selection) needs the real widgets.
        event.stop()
        self.unfold()

    def on_resize(self, event) -> None:
        # Hidden widgets' heights change with the width (a Resize also comes when only the
        # content's height changed, which folding itself does).
        if event.size.width != self._folded_width:
            self._folded_width = event.size.width
            self.unfold()

    BINDINGS = [
        Binding("up,k", "select(-1)", "Previous", show=False),
        Binding("down,j", "select(1)", "Next", show=False),
        Binding("c", "act('copy')", "Copy"),
        Binding("e", "act('edit')", "Edit"),
        Binding("left", "act('older')", "Older version", show=False),
        Binding("right", "act('newer')", "Newer version", show=False),
        Binding("escape", "act('leave')", "Back", show=False),
    ]

    @dataclass
    class Action(Message):
        """The user asked for ``action`` on the selected message (``code`` carries a number)."""

        action: str
        message: UserMessage | ReplyView | None
        number: int = 0

    selected: UserMessage | ReplyView | None = None

    # The log's own children are the conversation's messages, notices and queued prompts: lookups
    # scan them, never the whole subtree (a query matches every widget of every reply: ~1,000
    # widgets and ~9 ms a query in 50 turns, against 0.02 ms for the scan).

    def messages(self) -> list[UserMessage | ReplyView]:
        return [w for w in self.children if isinstance(w, (UserMessage, ReplyView))]

    def prompts(self) -> list[UserMessage]:
        return [w for w in self.children if isinstance(w, UserMessage)]

    def select(self, widget: UserMessage | ReplyView | None) -> None:
        self.unfold()
        if self.selected is not None:
            self.selected.remove_class("-selected")
        self.selected = widget
        if widget is not None:
            widget.add_class("-selected")
            self.scroll_to_widget(widget, animate=False)

    def action_select(self, step: int) -> None:
        items = self.messages()
        if not items:
            return
        index = items.index(self.selected) + step if self.selected in items else len(items) - 1
        if index < 0 and self._earlier:
            self.call_later(self._select_above, items[0])
            return
        self.select(items[max(0, min(len(items) - 1, index))])

    def on_key(self, event) -> None:
        if event.key in "123456789" and len(event.key) == 1:
            event.stop()
            self.post_message(self.Action("code", self.selected, int(event.key)))

    def action_act(self, action: str) -> None:
        self.post_message(self.Action(action, self.selected))

    def on_blur(self) -> None:
        self.select(None)

    async def show_turns(self, turns: list[TurnRecord], forks: dict[int, tuple[int, int]] | None = None) -> None:
        """Replace the log with a stored session's turns; ``forks``: {seq: (version on screen,
        versions)} for turns an edit or a retry forked."""
        async with self._mounting_earlier:  # not while a page is being mounted above
            self.unfold()
            await self.remove_children()
            self._away.forget()
            self.selected = None
            self._earlier, self._forks = turns, forks or {}
            widgets: list[Widget] = list(self._last_page())
            self._earlier_line = None
            if self._earlier:
                self._earlier_line = EarlierMessages(markup=False)
                self._earlier_line.show_count(len(self._earlier))
                widgets.insert(0, self._earlier_line)
            if widgets:
                await self.mount_all(widgets)
            self.anchor()
        # Once the stored replies are drawn (their Markdown renders after mounting, so their
        # height is not known after the next refresh), fold what lies above the view; if the
        # user sends sooner, adding the prompt folds it.
        self.set_timer(HISTORY_FOLD_DELAY_S, self.fold_history)

    async def show_earlier(self) -> bool:
        """Mount the page of stored messages above those shown, keeping the view where it was;
        False when every message is shown already."""
        async with self._mounting_earlier:  # a scroll and a selection may both ask at once
            line = self._earlier_line  # there while turns are left in ``_earlier``
            if line is None:
                return False
            shown = self.messages()
            anchor = shown[0] if shown else None
            offset = anchor.virtual_region.y - self.scroll_y if anchor is not None else 0
            await self.mount_all(self._last_page(), after=line)
            if self._earlier:
                line.show_count(len(self._earlier))
            else:
                self._earlier_line = None
                await line.remove()
        if anchor is not None:
            def keep_in_view() -> None:
                self.scroll_to(y=anchor.virtual_region.y - offset, animate=False, immediate=True)

            self.call_after_refresh(keep_in_view)
        return True

    async def _select_above(self, first: UserMessage | ReplyView) -> None:
        """Select the message above ``first``, the first one shown, mounting its page."""
        if await self.show_earlier():
            items = self.messages()
            if first in items:  # (not if another session was shown meanwhile)
                self.select(items[items.index(first) - 1])

    def _last_page(self) -> list[UserMessage | ReplyView]:
        """The widgets of the last page of the turns not shown yet, taken from ``_earlier``."""
        start = page_start(self._earlier)
        page, self._earlier = self._earlier[start:], self._earlier[:start]
        return self._stored_widgets(page, self._forks)

    def _stored_widgets(self, turns: list[TurnRecord],
                        forks: dict[int, tuple[int, int]]) -> list[UserMessage | ReplyView]:
        """Stored turns as widgets: a prompt each, and a reply each with the tool rounds that
        led to it (``stored_rounds``)."""
        return [UserMessage(item.content, forks.get(item.seq), item.seq, item.images,
                            pictures=self._stored_pictures)
                if isinstance(item, TurnRecord) else self._stored_reply(item)
                for item in group_rounds(turns)]

    def _stored_reply(self, stored: StoredReply) -> ReplyView:
        turn = stored.final
        if turn is None:  # stopped during its calls: the rounds alone
            return ReplyView("", "", stopped=True, earlier=stored.rounds)
        thinking, answer = split_reply(turn.content)
        view = ReplyView(answer, reply_caption(turn.model, turn.timings, stopped=turn.stopped),
                         stopped=turn.stopped, thinking=thinking, show_thinking=self.show_thinking,
                         earlier=stored.rounds)
        if view.thinking is not None:
            view.thinking.title = thinking_title(turn.timings, stopped=turn.stopped)
        return view

    def set_show_thinking(self, show: bool) -> None:
        """Open (or fold) every reasoning block, and the ones still to come."""
        self.unfold()  # hidden blocks change height: the spacer standing in for them would not
        self.show_thinking = show
        for reply in self.children:
            if isinstance(reply, ReplyView):
                reply.show_thinking = show
                for block in reply.thinking_blocks():  # one per tool round that reasoned
                    if not block.streaming:
                        block.collapsed = not show

    async def add_turns_before_prompt(self, turns: list[TurnRecord], reply: ReplyView) -> None:
        """Show stored ``turns`` just above the prompt that ``reply`` answers (turns another
        process stored before that prompt was sent)."""
        children = list(self.children)
        if reply not in children:  # the log was redrawn meanwhile (from the store: it has them)
            return
        index = children.index(reply)
        prompt = children[index - 1] if index and isinstance(children[index - 1], UserMessage) else reply
        await self.mount_all(self._stored_widgets(turns, {}), before=prompt)

    async def add_prompt(self, text: str, images: tuple[ImageFile, ...] = ()) -> ReplyView:
        """Show a sent prompt (its pictures named above it) and an empty reply below it, and
        follow the new text."""
        reply = ReplyView(finished=False, show_thinking=self.show_thinking)
        # Previewed from the attached files' bytes: the store may still be writing its copies.
        attached = {image.ref.sha256: image.data for image in images}
        prompt = UserMessage(text, images=tuple(image.ref for image in images),
                             pictures=lambda ref: attached.get(ref.sha256))
        await self.fold_history()
        await self.mount_before_queued(prompt, reply)
        self.anchor()
        return reply

    async def add_queued(self, text: str, position: int) -> QueuedPrompt:
        """Show a queued message at the end of the log (it moves up as replies arrive above it)."""
        view = QueuedPrompt(text, position)
        await self.mount(view)
        self.anchor()
        return view

    async def mount_before_queued(self, *widgets: Static | Vertical) -> None:
        """Add conversation widgets above any queued messages, which stay last."""
        queued = next((w for w in self.children if isinstance(w, QueuedPrompt)), None)
        if queued is not None:
            await self.mount_all(widgets, before=queued)
        else:
            await self.mount_all(widgets)

    def last_reply(self) -> ReplyView | None:
        return next((w for w in reversed(self.children) if isinstance(w, ReplyView)), None)

    async def add_notice(self, text: str) -> None:
        """A line for the user that is not part of the conversation (not saved)."""
        await self.mount_before_queued(Static(text, classes="notice", markup=False))

    async def clear_notices(self) -> None:
        await self.remove_children(".notice")  # matched against the log's own children only
