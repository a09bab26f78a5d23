"""A stored session as a document: Markdown for people (``/export``), JSON for programs.

Both show each system prompt where it took effect: a prompt set after the third turn applies from
the fourth, and an export that put it at the top would misstate what the model was told.
"""

from __future__ import annotations

import json
import time

from localchat.reasoning import split_reply
from localchat.store.records import TurnRecord
from localchat.store.store import Store


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
        return "## You\n\n" + turn.content + "\n"
    note = " (stopped)" if turn.stopped else ""
    thinking, answer = split_reply(turn.content)
    if thinking:  # folded in viewers that render HTML, readable in those that do not
        answer = f"<details><summary>Thinking</summary>\n\n{quote(thinking)}\n\n</details>\n\n{answer}"
    return f"## {turn.model or 'Assistant'}{note}\n\n" + answer + "\n"


def to_json(store: Store, session_id: int) -> str:
    """The session as one JSON object: its fields, its messages and where system prompts changed."""
    record = store.session(session_id)
    messages = [
        {"seq": t.seq, "role": t.role, "content": t.content, "model": t.model or None,
         "stopped": t.stopped, "finish_reason": t.finish_reason or None, "route": t.route or None,
         "created_at": t.created_at, "timings": t.timings.to_dict() if t.timings else None}
        for t in store.turns(session_id)
    ]
    document = {
        "id": record.id, "name": record.name, "title": record.title, "label": record.label,
        "system": record.system, "summary": record.summary, "created_at": record.created_at,
        "updated_at": record.updated_at,
        "system_changes": [{"after_seq": seq, "system": text} for seq, text in store.system_history(session_id)],
        "messages": messages,
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def quote(text: str) -> str:
    """``text`` as a Markdown block quote."""
    return "\n".join(f"> {line}" for line in text.splitlines())
