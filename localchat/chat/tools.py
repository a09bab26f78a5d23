"""The tools of a chat: what the app and ``ask`` hold to offer tools to the model and run its calls.

The API front ends use (the TUI, ``ask``; ``chat.tool_rounds`` runs the calls itself):

- ``ChatTools.open(settings, allow=())`` starts mcp.json's servers and the ``[tools]`` built-ins
  in the background and returns at once; ``problems`` are mcp.json's lines to show (a server
  that cannot start is left out, the others start); ``registry.add_listener(fn)`` tells of
  servers coming up or failing (``ServerStatus``, on the tools' own thread: hand it over);
  ``close()`` ends every server (at exit).
- ``ChatServices.tools`` (``chat.services``) holds the app's; ``Conversation.tool_choice`` is
  what a turn asks of the model ("auto", "none", "required" or a tool's name).
- A turn with tools is a ``chat.tool_rounds.ToolTurn``: its events are the reply's, then per call
  ``ToolCalled``, ``ToolApproval`` (answer ``event.request.answer(Decision.X)`` from any thread,
  show the notice it returns; Esc = ``Decision.DENY``), ``ToolReturned``; then the next reply's,
  in one stream ending with one ``Done``/``Failed``. The loop runs on the reader's thread: after a
  ``ToolApproval`` the next event comes once the request is answered, so a reader answers it
  before asking for the next event, or from another thread (the screen's) while it waits.
  ``turn.stop()`` (Esc) also cancels a call that is running and denies a question not yet
  answered. ``Conversation.send`` stores the turn's calls and results with its reply
  (``record_reply``); ``ask`` passes ``turn.rounds`` to ``record_exchange``.
- ``ChatTools.empty()`` offers nothing (no config): a turn is then a plain one.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.errors import UserError
from localchat.settings.tools import ToolsSettings
from localchat.tools.approval import AllowRules, ApprovalPolicy
from localchat.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from localchat.engine.options import Sampling
    from localchat.settings import Settings

TOOL_CHOICES = ("auto", "none", "required")


class ChatTools(AbstractContextManager["ChatTools"]):
    """One registry (servers and built-ins) and what the user allowed, for a process's chats.
    Use as a context manager, or close()."""

    def __init__(self, registry: ToolRegistry, policy: ApprovalPolicy,
                 settings: ToolsSettings | None = None) -> None:
        self.registry = registry
        self.policy = policy
        self.settings = settings or registry.settings

    @classmethod
    def open(cls, settings: Settings, allow: Sequence[str] = (), *,
             mcp_path: Path | None = None, config_path: Path | None = None) -> ChatTools:
        """The user's tools, started in the background (returns at once). ``allow``:
        ``--allow-tool`` rules. ``UserError`` for an empty rule."""
        rules = AllowRules(allow)
        registry = ToolRegistry.from_config(settings, mcp_path)
        registry.start()
        return cls(registry, ApprovalPolicy(settings.tools, rules, config_path))

    @classmethod
    def empty(cls) -> ChatTools:
        return cls(ToolRegistry(), ApprovalPolicy())

    def __repr__(self) -> str:
        return f"<ChatTools {self.registry!r}>"

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def problems(self) -> list[str]:
        """mcp.json's problems, one line each (each server named)."""
        return list(self.registry.problems)

    def offer(self, sampling: Sampling, tool_choice: str = "auto") -> Sampling:
        """``sampling`` with the tools that can be called now: a message never waits for a
        server still starting (its tools join a later turn), unless ``tool_choice`` demands a
        call ("required" or a tool's name), which waits for them up to ``start_timeout_s``.
        ``UserError`` for a demand no tool can meet."""
        check_tool_choice(tool_choice)
        if tool_choice == "none":
            return replace(sampling, tools=(), tool_choice="auto")
        if tool_choice != "auto":
            self._wait_for(tool_choice)
        specs = tuple(self.registry.specs())
        if not specs:
            if tool_choice != "auto":
                raise UserError(f"tool choice {tool_choice!r}: no tools are available (turn some "
                                "on in mcp.json or config.toml's [tools] builtins)")
            return replace(sampling, tools=(), tool_choice="auto")
        if tool_choice not in TOOL_CHOICES:
            tool = self.registry.find(tool_choice)
            if tool is None:
                names = ", ".join(spec["function"]["name"] for spec in specs)
                raise UserError(f"tool choice {tool_choice!r}: there is no such tool (the tools "
                                f"are: {names})")
            tool_choice = tool.exposed
        return replace(sampling, tools=specs, tool_choice=tool_choice)

    def _wait_for(self, tool_choice: str) -> None:
        if tool_choice == "required" and self.registry.tools() \
                or tool_choice not in TOOL_CHOICES and self.registry.find(tool_choice):
            return
        self.registry.wait_started(self.settings.start_timeout_s)

    def close(self) -> None:
        self.registry.close()


def check_tool_choice(choice: str) -> None:
    """``UserError`` for a tool choice that is neither a mode nor a possible tool name."""
    if not choice.strip():
        raise UserError("--tool-choice needs auto, none, required or a tool's name")
