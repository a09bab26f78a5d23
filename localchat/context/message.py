"""Message: one entry of a conversation's history, as the user and the model both see it.

A user's message, an assistant's reply (with the tool calls it asked for) or a tool's result.
The history keeps every one; what the model is shown of them is ``chat_context``'s business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localchat.reply.calls import ToolCall, ToolResult, assistant_message


@dataclass
class Message:
    role: str  # "user" | "assistant" | "tool"
    content: str  # a reply as the model wrote it (calls and markers included); a tool's result
    stopped: bool = False  # a reply the user interrupted (kept, marked)
    tool_calls: tuple[ToolCall, ...] = ()  # the calls an assistant reply asked for
    tool_call_id: str = ""  # a tool result: the call it answers
    name: str = ""  # a tool result: the tool's name
    # A user's pictures, as their files' bytes (the engine reads them through the model's
    # projector, once: see engine.image_records).
    images: tuple[bytes, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The message as templates and OpenAI's API take it (``tool_calls``, ``tool`` role)."""
        if self.role == "tool":
            return ToolResult(self.tool_call_id, self.name, self.content).to_message()
        if self.tool_calls:
            return assistant_message(self.content, list(self.tool_calls))
        if self.images:
            return {"role": self.role, "content": self.content, "images": list(self.images)}
        return {"role": self.role, "content": self.content}
