"""What there is to call: a tool as the model and the user see it, and a server as a listing
shows it. Plain records, shared by the registry, the approval policy, the chat and the app.

:class:`ToolInfo` is one tool (its server, name, description, input schema, and the name the
model sees); :class:`ServerStatus` is one server's state with the tools it offers now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

State = Literal["starting", "running", "failed", "disabled", "stopped"]


@dataclass(frozen=True)
class ToolInfo:
    """One tool: where it lives, what it is for, its input schema, and the name the model sees
    (``exposed``: the tool's own name unless two servers offer the same one)."""

    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    exposed: str = ""

    @property
    def label(self) -> str:
        """``server.tool``: how the user sees it."""
        return f"{self.server}.{self.name}"

    def spec(self) -> dict[str, Any]:
        """The tool as an OpenAI function spec (what templates and remote models take)."""
        schema = self.input_schema or {"type": "object", "properties": {}}
        return {"type": "function", "function": {
            "name": self.exposed or self.name, "description": self.description,
            "parameters": schema}}


@dataclass(frozen=True)
class ServerStatus:
    """A server as a listing shows it."""

    name: str
    transport: str
    target: str  # the command line or the URL (never headers or env: they may hold tokens)
    state: State
    tools: tuple[ToolInfo, ...] = ()
    error: str = ""
