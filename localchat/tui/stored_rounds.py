"""A stored turn's tool rounds, shown on reopen as they were shown live.

The store keeps a turn that called tools as it happened: the user's prompt, each reply that
called (an assistant turn with ``tool_calls``), one ``tool`` turn per result (its call's id, the
tool's ``server.tool`` label, whether it was an error, how long it took), and the final reply.
:func:`group_rounds` folds those runs into one item per reply on screen: the rounds (the text
each reply wrote before its calls, each call as its ⚙ line with the result folded under it)
above the final reply's text, as ``ReplyView(earlier=...)`` draws them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from textual.widget import Widget

from localchat.reply.calls import ToolCall, ToolResult
from localchat.reply.reasoning import split_reply
from localchat.store import TurnRecord
from localchat.tui.json_block import as_markdown
from localchat.tui.reply_view import RoundText
from localchat.tui.thinking import ThinkingBlock
from localchat.tui.tool_calls import ToolCallView


@dataclass
class StoredReply:
    """One reply on screen: ``final`` (None when the turn ended in its calls) and the rounds
    before it."""

    final: TurnRecord | None
    rounds: list[Widget] = field(default_factory=list)


def group_rounds(turns: Sequence[TurnRecord]) -> Iterator[TurnRecord | StoredReply]:
    """``turns`` with each assistant reply and the tool rounds before it as one ``StoredReply``;
    prompts as they are."""
    results = {t.tool_call_id: t for t in turns if t.role == "tool"}
    rounds: list[Widget] = []
    for turn in turns:
        if turn.role == "tool":
            continue
        if turn.role == "user":
            if rounds:
                yield StoredReply(None, rounds)
                rounds = []
            yield turn
        elif turn.tool_calls:
            rounds.extend(round_widgets(turn, results))
        else:
            yield StoredReply(turn, rounds)
            rounds = []
    if rounds:
        yield StoredReply(None, rounds)


def round_widgets(turn: TurnRecord, results: dict[str, TurnRecord]) -> list[Widget]:
    """A reply that called tools: its reasoning (folded), its text, and a line per call."""
    thinking, answer = split_reply(turn.answer)
    widgets: list[Widget] = []
    if thinking.strip():
        widgets.append(ThinkingBlock(thinking.strip(), title="Thought"))
    if answer.strip():
        widgets.append(RoundText(as_markdown(answer.strip())))
    for call in turn.tool_calls:
        widgets.append(stored_call(call, results.get(call.id)))
    return widgets


def stored_call(call: ToolCall, returned: TurnRecord | None) -> ToolCallView:
    if returned is None:  # the turn was stopped before this call returned
        view = ToolCallView(call, call.name)
        view.stopped()
        return view
    result = ToolResult(call.id, call.name, returned.content, returned.is_error, returned.notice)
    label = returned.tool_label or returned.tool_name or call.name
    return ToolCallView(call, label, result=result, elapsed_ms=returned.elapsed_ms)
