"""Tools the model may call: MCP servers (mcp.json) and a few built-ins, with the user's approval.

This package knows nothing of the app, the engine or the screen. Its parts:

- ``config``: mcp.json's ``mcpServers`` (stdio ``command/args/env/cwd`` or ``url/headers``), one
  problem line per bad entry, the others still start;
- ``registry``: :class:`ToolRegistry`, the synchronous facade over one asyncio loop on its own
  thread (``loop``) that owns every MCP session (``mcp_server``) and runs the built-ins
  (``builtin``): start in the background, list, call with a timeout and cancellation, close;
- ``results`` / ``schema``: every outcome as a :class:`~localchat.toolcalls.ToolResult` (inert,
  capped, an error the model reads and a notice the user sees), arguments checked first;
- ``approval``: may this call run? once / always (this session) / always (saved) / deny, and
  ``--allow-tool`` rules, as plain logic; the question travels as an object carrying a Future.

The words shared with the rest of localchat are ``localchat.toolcalls`` (``ToolCall``,
``ToolResult``, the families' call formats) and ``localchat.toolcall_stream`` (calls in a reply).

How phase 2 wires it in (the chat loop, with constrained sampling):

1. At app start: ``registry = ToolRegistry.from_config(settings); registry.start()`` (returns at
   once), print ``registry.problems``; ``policy = ApprovalPolicy(settings.tools, rules)``.
2. For a turn: ``specs = registry.specs()`` are the tools. The engine renders them with
   ``engine.tool_templates.with_tools(render, tool_rendering(template, render), specs)`` and
   constrains a call from the family's ``ToolFormat.triggers`` on; the reply's answer (after
   ``ReasoningSplitter``) goes through ``ToolCallSplitter(format, tool_names)``.
3. For each ``ToolCall``: ``request = policy.check(call, registry.find(call.name))``; None means
   it may run; otherwise the front end answers ``request`` (``ApprovalRequest.answer``) and the
   loop waits on ``request.future``; a denial gives ``denied_result``. Then
   ``registry.call(call, cancel=esc_event, max_chars=settings.tools.result_chars(n_ctx))``.
4. Results go back as ``ToolResult.to_message()`` after ``toolcalls.assistant_message(text,
   calls)``; at most ``settings.tools.max_rounds`` rounds; ``registry.close()`` at exit.
"""

from localchat.tools.approval import ApprovalPolicy, ApprovalRequest, Decision
from localchat.tools.mcp_server import ServerStatus, ToolInfo
from localchat.tools.registry import ToolRegistry

__all__ = ["ApprovalPolicy", "ApprovalRequest", "Decision", "ServerStatus", "ToolInfo",
           "ToolRegistry"]
