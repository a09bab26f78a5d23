"""One assistant reply on screen: ``ReplyView``, its Markdown body and caption, streamed, then
finished once, and ``reply_caption``, the line under it.

A reply that called tools is shown in rounds: what the model wrote before its calls stays above
them as finished Markdown (``end_round``), each call is a compact ⚙ line with its result folded
under it (``localchat.tui.tool_calls``), and the next round's text streams into the body below,
so the answer reads in the order it was written. Stored rounds come back the same way
(``earlier``).
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Markdown, Static

from localchat.events import Done, Timings
from localchat.tui.json_block import STREAMING_FENCE, as_markdown
from localchat.tui.laid_out_once import LaidOutOnce
from localchat.tui.live_markdown import LiveMarkdown
from localchat.tui.superseded_reply import SupersededReply
from localchat.tui.thinking import ThinkingBlock
from localchat.tui.tool_calls import ToolCallView, without_calls


def reply_caption(model: str, timings: Timings | None, *, stopped: bool) -> str:
    """The line under a reply: who answered, how fast, by which route, and whether it was cut."""
    parts = [model or "assistant"]
    if timings is not None and timings.predicted_per_second:
        parts.append(f"{timings.predicted_n} tokens · {timings.predicted_per_second:.1f} tok/s")
    if timings is not None and timings.route and timings.route != "local":
        reason = f" ({timings.route_reason})" if timings.route_reason else ""
        parts.append(f"{timings.route}{reason}")
    if stopped:
        parts.append("■ stopped")
    return " · ".join(parts)



class ReplyView(LaidOutOnce, Vertical):
    """One assistant reply: its Markdown body and a caption. Streams, then finishes once."""

    def __init__(self, text: str = "", caption: str = "", *, stopped: bool = False, finished: bool = True,
                 thinking: str = "", show_thinking: bool = False, earlier: Sequence[Widget] = ()) -> None:
        """``earlier``: a stored reply's tool rounds (their text and calls), shown above it."""
        super().__init__(classes="-stopped" if stopped else "")
        self._earlier = list(earlier)
        self._calls: dict[str, ToolCallView] = {}  # this turn's tool calls, by call id
        self._initial = as_markdown(text)  # a stored reply that is JSON: a JSON block
        self._caption = caption
        self.text = text  # the answer (reasoning, if any, is in the thinking block)
        self.json_block = False  # the answer of a /format turn: shown as JSON from its start
        self._fenced = False  # the streaming body has the JSON block's opening fence
        self.finished = finished  # False while it streams
        self.show_thinking = show_thinking  # keep the reasoning open when the answer starts
        self._thinking = ThinkingBlock(thinking, expanded=show_thinking) if thinking else None

    def compose(self):
        yield from self._earlier
        if self._thinking is not None:
            yield self._thinking
        yield LiveMarkdown(self._initial)
        yield Static(self._caption, classes="caption", markup=False)

    @property
    def body(self) -> LiveMarkdown:
        return self.query_one(LiveMarkdown)

    @property
    def thinking(self) -> ThinkingBlock | None:
        return self._thinking

    def thinking_blocks(self) -> list[ThinkingBlock]:
        """Every reasoning block of the reply: the last one's, and those of its tool rounds."""
        return [w for w in self.children if isinstance(w, ThinkingBlock)]

    async def think(self, fragment: str) -> None:
        """Stream reasoning into the thinking block (opened above the answer on first use)."""
        if self._thinking is None:
            self._thinking = ThinkingBlock(streaming=True)
            await self.mount(self._thinking, before=self.body)
        self._thinking.append(fragment)

    async def append(self, fragment: str) -> None:
        if self._thinking is not None and self._thinking.streaming:
            self._thinking.answer_started(keep_open=self.show_thinking)
        if self.json_block and not self._fenced:
            self._fenced = True
            await self.body.feed(STREAMING_FENCE + "json\n")
        self.text += fragment
        await self.body.feed(fragment)

    async def end_round(self) -> None:
        """The model called tools after writing what the body shows: that text stays above the
        calls as finished Markdown, and the body starts again empty for the next round."""
        if self._thinking is not None:
            self._thinking.answer_started(keep_open=self.show_thinking)
            self._thinking = None  # the next round's reasoning gets a block of its own
        if self.text.strip():
            await self.mount(RoundText(as_markdown(self.text, json_block=self.json_block)),
                             before=self.body)
        self.text = ""
        self._fenced = False
        await self.body.reset()

    async def add_call(self, view: ToolCallView) -> None:
        """Show a call the model made, below the text it wrote before it."""
        if self.text.strip() or self._thinking is not None:
            await self.end_round()
        self._calls[view.call_id] = view
        await self.mount(view, before=self.body)

    def call_view(self, call_id: str) -> ToolCallView | None:
        return self._calls.get(call_id)

    @property
    def calls(self) -> list[ToolCallView]:
        return list(self._calls.values())

    @property
    def superseded(self) -> SupersededReply | None:
        found = self.query(SupersededReply)
        return found.first() if found else None

    async def supersede(self, reason: str) -> None:
        """The reply is being handed to the remote model: fold the local text written so far into
        a collapsed block above an empty body, where the remote's answer will stream."""
        if self.text.strip():
            await self.mount(SupersededReply(self.text, reason), before=self.body)
        self.text = ""
        self._fenced = False
        await self.body.reset()

    async def unsupersede(self) -> None:
        """The remote failed part-way: its text is void, and a local reply stands after all (the
        superseded one, which ``finish`` renders, or a new one that streams in), so the folded
        copy goes too."""
        await self.query(SupersededReply).remove()
        self.text = ""
        self._fenced = False
        await self.body.reset()

    def final_answer(self, done: Done) -> str:
        """The text this reply ends with, from the turn's ``done``. After tool rounds, the last
        round's as it streamed: a turn stopped during its calls (or past its round limit) ends
        with the reply that called, whose text is shown above the calls already and still holds
        the calls as the model wrote them."""
        if self._calls:
            return self.text
        return without_calls(done.answer, done.tool_calls)

    async def finish(self, reply: str, caption: str, *, stopped: bool, thinking: str = "",
                     timings: Timings | None = None) -> None:
        """End streaming and render the answer ``reply`` whole (its reasoning ``thinking`` in the
        block above); mark it if the user stopped it."""
        if thinking and self._thinking is None:
            self._thinking = ThinkingBlock(thinking, expanded=self.show_thinking)
            await self.mount(self._thinking, before=self.body)
        if self._thinking is not None:
            self._thinking.finish(thinking, timings, stopped=stopped, keep_open=self.show_thinking)
        self.text = reply
        await self.body.finish(as_markdown(reply, json_block=self.json_block))
        self.set_class(stopped, "-stopped")
        self.query_one(".caption", Static).update(caption)
        self.finished = True

    async def fail(self, message: str) -> None:
        # The partial reply stays, drawn whole.
        await self.body.finish(as_markdown(self.text, json_block=self.json_block))
        self.add_class("-failed")
        self.query_one(".caption", Static).update(f"✖ {message}")
        self.finished = True


class RoundText(Markdown):
    """What the model wrote in a round that ended in tool calls (finished, never streamed again)."""
