"""Reading a model's reply text: what is reasoning, what is answer, and what is a tool call.

- ``reasoning``: ``<think>…</think>`` blocks split from the answer as the reply streams;
- ``calls``: the call and result types every layer shares (:class:`~localchat.reply.calls.ToolCall`,
  :class:`~localchat.reply.calls.ToolResult`) and their ids;
- ``families``: the one table of model families that call tools (markers, triggers, openings,
  grammar pieces, id rules), which the parser, the call grammar and the chat templates all read;
- ``call_openers``, ``call_readers``, ``call_stream``: finding a call's opening in a stream,
  reading its body, and splitting a streamed reply into answer text and calls;
- ``lenient_json``: JSON as small models write it.

Plain logic with no model: the engine, the remote, ``serve`` and the front ends all read replies
through it.
"""
