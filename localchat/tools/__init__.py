"""Tools the model may call: MCP servers (mcp.json) and a few built-ins, with the user's approval.

This package knows nothing of the app, the engine or the screen. Its parts:

- ``config``: mcp.json's ``mcpServers`` (stdio ``command/args/env/cwd`` or ``url/headers``), one
  problem line per bad entry, the others still start;
- ``catalogue``: what there is to call, as the rest of localchat sees it: :class:`ToolInfo` (a
  tool, its input schema, the name the model sees) and :class:`ServerStatus` (a server's state);
- ``registry``: :class:`ToolRegistry`, the synchronous facade over one asyncio loop on its own
  thread (``async_thread``) that owns every MCP session (``mcp_server``) and runs the built-ins
  (``builtin``): start in the background, list, resolve a call to its tool once, run it with a
  timeout and cancellation, close;
- ``results``: every outcome as a :class:`~localchat.reply.calls.ToolResult` (inert, capped, an
  error the model reads and a notice the user sees); the arguments are checked against the
  tool's input schema first (``localchat.formats.validate.arguments_problem``);
- ``approval``: may this call run? once / always (this session) / always (saved) / deny, and
  ``--allow-tool`` rules, as plain logic; the question travels up as an
  :class:`ApprovalRequest` carrying a Future (``localchat.events.ApprovalQuestion``, answered
  with a :class:`~localchat.events.Decision`).

The words shared with the rest of localchat are ``localchat.reply.calls`` (``ToolCall``,
``ToolResult``), ``localchat.reply.families`` (how each model family writes a call) and
``localchat.events`` (the approval question and its decision). A call goes through, in order:
``registry.resolve(call)`` (the tool, or the error result it gets instead),
``policy.check(call, tool)`` (None, or the question to put to the user),
``registry.call(resolved)``; ``localchat.chat.tool_rounds`` runs these rounds for a turn.
"""

from localchat.events import Decision
from localchat.tools.approval import ApprovalPolicy, ApprovalRequest
from localchat.tools.catalogue import ServerStatus, ToolInfo
from localchat.tools.registry import ResolvedCall, ToolRegistry

__all__ = ["ApprovalPolicy", "ApprovalRequest", "Decision", "ResolvedCall", "ServerStatus",
           "ToolInfo", "ToolRegistry"]
