"""Tools the model may call: MCP servers (mcp.json) and a few built-ins, with the user's approval.

This package knows nothing of the app, the engine or the screen. Its parts:

- ``config``: mcp.json's ``mcpServers`` (stdio ``command/args/env/cwd`` or ``url/headers``), one
  problem line per bad entry, the others still start;
- ``registry``: :class:`ToolRegistry`, the synchronous facade over one asyncio loop on its own
  thread (``loop``) that owns every MCP session (``mcp_server``) and runs the built-ins
  (``builtin``): start in the background, list, call with a timeout and cancellation, close;
- ``results`` / ``schema``: every outcome as a :class:`~localchat.reply.calls.ToolResult` (inert,
  capped, an error the model reads and a notice the user sees), arguments checked first;
- ``approval``: may this call run? once / always (this session) / always (saved) / deny, and
  ``--allow-tool`` rules, as plain logic; the question travels as an object carrying a Future.

The words shared with the rest of localchat are ``localchat.reply.calls`` (``ToolCall``,
``ToolResult``, the families' call formats) and ``localchat.reply.call_stream`` (calls in a reply).

How phase 2 wires it in (the chat loop, with constrained sampling):

1. At app start: ``registry = ToolRegistry.from_config(settings); registry.start()`` (returns at
   once) and show ``registry.problems``; ``policy = ApprovalPolicy(settings.tools,
   AllowRules(args.allow_tool))``; ``registry.add_listener`` to show servers coming up or failing.
2. For a turn: ``specs = registry.specs()``. The engine renders them with
   ``engine.tool_templates.with_tools(render, tool_rendering(template, render), specs)``
   (probe once per model), detokenizes the format's ``preserved_tokens`` as text, and
   constrains a call from ``ToolFormat.triggers`` / ``reply.calls.start_trigger(format, names)``
   on. The answer (after ``ReasoningSplitter``) goes through ``ToolCallSplitter(format, names)``;
   ``in_call`` tells when a call has begun.
3. For each ``ToolCall``: one with a ``problem`` never runs, the model gets
   ``failed_call_result(call)``; else ``tool = registry.find(call.name)`` and
   ``request = policy.check(call, tool)``: None means it may run; otherwise the front end shows
   ``request.line`` and calls ``request.answer(Decision...)`` (its return is a notice), the loop
   waits on ``request.future``, and ``DENY`` gives ``results.denied_result(call, tool.label)``.
   Then ``registry.call(call, cancel=esc_event, max_chars=settings.tools.result_chars(n_ctx))``
   returns a ``ToolResult`` whatever happens; its ``notice`` is the user's line.
4. The history gains ``reply.calls.assistant_message(text, calls)`` and each
   ``ToolResult.to_message()``; at most ``settings.tools.max_rounds`` rounds; a remote model's
   OpenAI ``tool_calls`` become calls through ``ToolCall.from_openai``; ``registry.close()`` at
   exit ends every server.
"""

from localchat.tools.approval import ApprovalPolicy, ApprovalRequest, Decision
from localchat.tools.mcp_server import ServerStatus, ToolInfo
from localchat.tools.registry import ToolRegistry

__all__ = ["ApprovalPolicy", "ApprovalRequest", "Decision", "ServerStatus", "ToolInfo",
           "ToolRegistry"]
