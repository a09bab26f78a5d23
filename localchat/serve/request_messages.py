"""A request's ``messages`` as the chat history's dicts: the API's own content shapes read by the
caller, an assistant message's ``tool_calls`` and each ``tool`` result checked against the calls
it answers (``tool_fields``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localchat.serve.fields import field_of, shown
from localchat.serve.http_errors import bad
from localchat.serve.tool_fields import calls_of, tool_result

ROLES = ("system", "user", "assistant", "tool")


ContentOf = Callable[[dict[str, Any], str], "str | tuple[str, list[bytes]]"]


def message_list(obj: dict[str, Any], content_of: ContentOf) -> list[dict[str, Any]]:
    """``messages``: a non-empty array of ``{"role", "content"}`` with known roles; each
    message's text is ``content_of(message, "messages[i].")`` (the API's own content shapes),
    with its pictures (a user message's ``images``: encoded bytes, as the engine takes them);
    an assistant message may carry ``tool_calls`` and a ``tool`` message answers one."""
    value = field_of(obj, "messages", list)
    if not value:
        raise bad("messages", "must be a non-empty array of messages")
    messages: list[dict[str, Any]] = []
    unanswered: list[dict[str, Any]] = []  # the last assistant message's calls
    for i, message in enumerate(value):
        where = f"messages[{i}]."
        if not isinstance(message, dict):
            raise bad(f"messages[{i}]", f"must be an object, not {shown(message)}")
        role = field_of(message, "role", str, where)
        if role is None:
            raise bad(where + "role", "is missing")
        role = "system" if role == "developer" else role  # OpenAI's newer name for it
        if role not in ROLES:
            raise bad(where + "role", f"must be one of {', '.join(ROLES)} (or developer), "
                                      f"not {shown(role)}")
        content = content_of(message, where)
        images: list[bytes] = []
        if isinstance(content, tuple):
            content, images = content
            if role != "user":
                raise bad(where + "content", f"pictures go in user messages, not in {role} ones")
        if role == "tool":
            messages.append(tool_result(message, where, content, unanswered))
            continue
        entry: dict[str, Any] = {"role": role, "content": content}
        if images:
            entry["images"] = images
        if message.get("tool_calls") is not None:
            if role != "assistant":
                raise bad(where + "tool_calls", "may only be on an assistant message")
            calls = calls_of(message, where, i)
            if calls:
                entry["tool_calls"] = calls
            unanswered = list(calls)
        messages.append(entry)
    return messages
