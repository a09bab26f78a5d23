"""A stored session as a document: Markdown for people (``/export``), JSON for programs.

Both show each system prompt where it took effect: a prompt set after the third turn applies from
the fourth, and an export that put it at the top would misstate what the model was told.

A message's pictures are referred to, not embedded: Markdown gives a line per picture with its
name, size and SHA-256; JSON gives those and ``path``, the stored copy under the localchat home
(``store.images``; null when it is gone), which stays as long as a session uses the picture.
"""

from __future__ import annotations

import json
import time
from typing import Any

from localchat.reply.calls import ToolCall
from localchat.reply.reasoning import split_reply
from localchat.store.records import ImageRef, TurnRecord
from localchat.store.store import Store
from localchat.terminal import visible


def to_markdown(store: Store, session_id: int) -> str:
    """The session as a Markdown document."""
    record = store.session(session_id)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    parts = [f"# {record.label}\n", f"_Exported from localchat on {when}._\n"]
    # {after_seq: system prompt in force from the next turn on}; the last change at a seq wins.
    changes = dict(store.system_history(session_id))
    if not changes and record.system:  # set before localchat recorded changes
        changes = {0: record.system}
    for turn in [None, *store.turns(session_id)]:
        seq = 0 if turn is None else turn.seq
        if turn is not None:
            parts.append(_turn_markdown(turn))
        if seq in changes:
            text = changes[seq]
            heading = "**System prompt:**" if seq == 0 else "**System prompt changed to:**"
            parts.append(f"{heading}\n\n{quote(text)}\n" if text else "**System prompt cleared.**\n")
    return "\n".join(parts)


def _turn_markdown(turn: TurnRecord) -> str:
    if turn.role == "user":
        pictures = "".join(f"{image_line(ref)} `sha256:{ref.sha256}`\n\n" for ref in turn.images)
        return "## You\n\n" + pictures + turn.content + "\n"
    if turn.role == "tool":
        return _result_markdown(turn)
    note = " (stopped)" if turn.stopped else ""
    thinking, answer = split_reply(turn.answer)
    if thinking:  # folded in viewers that render HTML, readable in those that do not
        answer = f"<details><summary>Thinking</summary>\n\n{quote(thinking)}\n\n</details>\n\n{answer}"
    calls = "".join(f"\n⚙ `{call_line(call)}`\n" for call in turn.tool_calls)
    return f"## {turn.model or 'Assistant'}{note}\n\n" + answer + "\n" + calls


def _result_markdown(turn: TurnRecord) -> str:
    """A tool's result, folded under a line naming the call (an error marked)."""
    label = turn.tool_label or turn.tool_name
    outcome = " (error)" if turn.is_error else ""
    fence = "````" if "```" in turn.content else "```"
    return (f"<details><summary>⚙ {label} result{outcome}</summary>\n\n{fence}\n{turn.content}\n"
            f"{fence}\n\n</details>\n")


def to_json(store: Store, session_id: int) -> str:
    """The session as one JSON object: its fields, its messages and where system prompts changed."""
    record = store.session(session_id)
    messages = [_message_json(t, store) for t in store.turns(session_id)]
    document = {
        "id": record.id, "name": record.name, "title": record.title, "label": record.label,
        "system": record.system, "summary": record.summary, "created_at": record.created_at,
        "updated_at": record.updated_at,
        "system_changes": [{"after_seq": seq, "system": text} for seq, text in store.system_history(session_id)],
        "messages": messages,
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def _message_json(t: TurnRecord, store: Store) -> dict[str, Any]:
    message: dict[str, Any] = {
        "seq": t.seq, "role": t.role, "content": t.content, "model": t.model or None,
        "stopped": t.stopped, "finish_reason": t.finish_reason or None, "route": t.route or None,
        "created_at": t.created_at, "timings": t.timings.to_dict() if t.timings else None}
    if t.tool_calls:  # OpenAI's shape; ``content`` is the reply as written, ``answer`` as shown
        message["tool_calls"] = [call.to_openai() for call in t.tool_calls]
        message["answer"] = t.answer
    if t.images:
        message["images"] = [_image_json(ref, store) for ref in t.images]
    if t.role == "tool":
        message.update(tool_call_id=t.tool_call_id, name=t.tool_name, label=t.tool_label,
                       is_error=t.is_error, notice=t.notice or None, elapsed_ms=t.elapsed_ms)
    return message


def _image_json(ref: ImageRef, store: Store) -> dict[str, Any]:
    path = store.image_path(ref)
    return {**ref.to_dict(), "path": str(path) if path.is_file() else None}


def image_line(ref: ImageRef) -> str:
    """``[image: cat.png 640x480]``, the name shown inert."""
    return f"[image: {visible(ref.label, newlines=False)}]"


def call_line(call: ToolCall) -> str:
    """``name({"arg": ...})`` on one inert line."""
    line = visible(f"{call.name}({call.arguments_json()})", newlines=False)
    return line if len(line) <= 200 else line[:198] + "…)"


def quote(text: str) -> str:
    """``text`` as a Markdown block quote."""
    return "\n".join(f"> {line}" for line in text.splitlines())
