"""A stored conversation with a model attached, the same for the app and ``ask --session``.

- ``conversation``: one stored session plus the ``ChatContext`` that continues it; every change
  goes to both (the store is what the user saw, the ``ChatContext`` what the model sees).
- ``escalation``: the router a turn that may go to the remote model is sent through.
- ``services``: what a conversation uses besides its engine, built once from config.toml.
- ``speed``: the app's ``/stats`` page, drawn from the store's speed numbers.
- ``snapshots``: a session's KV cache saved after each reply and restored when it is reopened.
- ``tools``: the tools a chat offers (mcp.json's servers started in the background, the
  built-ins) and what the user allowed; ``tool_rounds``: a turn whose tool calls are
  shown, approved, run and answered before the model goes on (the front ends' API is in
  ``tools``' docstring).

Above ``context/`` (the conversation as data) and ``store/`` (SQLite); imports no UI.
"""
