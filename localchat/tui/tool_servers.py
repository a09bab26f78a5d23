"""The tool servers as the app shows them: started at open without holding anything up, and
each coming up or failing told in a notice.

The chat layer owns the :class:`~localchat.tools.ToolRegistry` (``ChatServices.tools``: its
servers end when the app does); it is started when the app builds its services at open, which
returns at once: the servers come up on
the registry's own thread while the model loads and the user types, and a message that calls no
tool never waits for them. mcp.json's problems (one line each, naming the file and the server)
are shown first; then every change of a server's state arrives on the registry's thread and is
handed to the UI thread as a :class:`ToolServerChanged` message:

- running: ``⚙ NAME: N tools ready`` (a brief notice);
- failed: ``⚙ MCP server NAME failed: why`` (the last line of its stderr), an error that stays
  a while; ``localchat tools`` lists the whole picture;
- stopped (a server that exited after it was running): a warning.

A server's stderr never reaches the screen (the registry sends it to the log file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from localchat.chat.tools import TOOL_CHOICES
from localchat.errors import UserError
from localchat.settings.tools import BUILTIN_SERVER
from localchat.terminal import visible

if TYPE_CHECKING:
    from localchat.chat.conversation import Conversation
    from localchat.chat.services import ChatServices
    from localchat.tools import ServerStatus, ToolRegistry
    from localchat.tui.host import Host

FAILURE_NOTICE_S = 15


@dataclass
class ToolServerChanged(Message):
    """A tool server's state changed (posted from the registry's thread)."""

    status: ServerStatus


def status_notice(status: ServerStatus) -> tuple[str, str] | None:
    """(message, severity) for a server's new state; None when there is nothing to tell."""
    name = visible(status.name, newlines=False)
    if status.state == "running":
        count = len(status.tools)
        return f"⚙ {name}: {count} tool{'s' if count != 1 else ''} ready", "information"
    if status.state == "failed":
        why = visible(status.error, newlines=False) or "no reason given"
        return f"⚙ MCP server {name} failed: {why}", "error"
    if status.state == "stopped":
        return f"⚙ MCP server {name} stopped; its tools are gone until localchat restarts", "warning"
    return None


def services_registry(services: ChatServices | None) -> ToolRegistry | None:
    """The chat services' tool registry (``ChatServices.tools``), where they have one."""
    tools = services.tools if services is not None else None
    return tools.registry if tools is not None else None


class ToolServers:
    """The registry's servers, as notices (see the module)."""

    def __init__(self, host: Host) -> None:
        self._host = host
        self.registry: ToolRegistry | None = None
        self._shown: dict[str, str] = {}  # server -> the state last told

    def start(self, registry: ToolRegistry | None) -> None:
        """Start ``registry`` in the background (returns at once) and tell what it reports."""
        if registry is None or self.registry is registry:
            return
        self.registry = registry
        for problem in registry.problems:
            self._host.notify(visible(problem, newlines=False), title="mcp.json", severity="error",
                              timeout=FAILURE_NOTICE_S)
        registry.add_listener(self._changed)
        registry.start()
        for status in registry.statuses():  # a registry started before the app listened
            if status.name != BUILTIN_SERVER:
                self.show(status)

    def page(self, choice: str) -> str:
        """``/tools``: each server, its state and its tools, as a Markdown page."""
        lines = ["# Tools", "",
                 f"This session's messages: tool choice `{choice}` (change it with `/tools auto`, "
                 "`none`, `required` or a tool's name).", ""]
        registry = self.registry
        statuses = registry.statuses() if registry is not None else []
        for status in statuses:
            if status.name == BUILTIN_SERVER and status.state == "disabled":
                lines += ["Built-in tools: off (list them in `[tools] builtins` of config.toml).", ""]
                continue
            lines += [f"## `{visible(status.name, newlines=False)}` · {status.state}", ""]
            if status.error:
                lines += [f"> {visible(status.error, newlines=False)}", ""]
            for info in status.tools:
                about = visible(info.description.strip().split("\n")[0], newlines=False) \
                    if info.description.strip() else ""
                lines.append(f"- `{visible(info.exposed or info.name, newlines=False)}` {about}")
            lines.append("")
        if registry is not None:
            lines += [f"- {visible(problem, newlines=False)}" for problem in registry.problems]
        if len(statuses) <= 1 and (registry is None or not registry.problems):
            lines.append("No MCP servers: add them to `mcp.json` in the config folder "
                         "(`localchat tools` shows where).")
        return "\n".join(lines)

    def set_choice(self, conversation: Conversation, choice: str) -> str:
        """Set what ``conversation``'s messages ask of the model; the notice to show.
        ``UserError`` for a tool that does not exist (yet: its server may still start)."""
        choice = choice.strip()
        word = choice.lower()
        if word in TOOL_CHOICES:
            choice = word
        elif self.registry is None or self.registry.find(choice) is None:
            raise UserError(f"/tools {choice}: there is no such tool (yet): /tools lists them")
        conversation.tool_choice = choice
        meaning = {"auto": "the model may call tools", "none": "no tools are offered",
                   "required": "the model must call a tool"}.get(choice, f"the model must call {choice}")
        return f"Tool choice {choice}: {meaning}, from the next message of this session."

    def _changed(self, status: ServerStatus) -> None:
        """On the registry's thread: hand over to the UI thread (unless the app is gone)."""
        if not self._host.closed:
            self._host.post_message(ToolServerChanged(status))

    def show(self, status: ServerStatus) -> None:
        if self._shown.get(status.name) == status.state:
            return
        self._shown[status.name] = status.state
        told = status_notice(status)
        if told is None:
            return
        message, severity = told
        timeout = FAILURE_NOTICE_S if severity == "error" else None
        self._host.notify(message, severity=severity, timeout=timeout)
