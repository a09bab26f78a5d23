"""``localchat bench``: measurements of what a user feels, on one loaded model, with targets.

- ``script``: the conversation a bench replays, and ``run_turn``, which drains one turn;
- ``conversation``: the default mode — a replay with KV reuse, a fresh-context baseline and the
  exactness of cached replies, a system prompt change; ``decode``: decode speed against
  llama.cpp's own loop, and stop latency;
- ``restore`` (``--restore``): a long session reopened in a new process from its KV snapshot;
- ``app`` (``--tui``) and ``typing_prefill`` (``--typing``): the running app, headless;
- ``router`` (``--router``): escalation scored on a labelled prompt set;
- ``targets``: the limits each mode checks; ``report``: JSON or text output.

``localchat.commands.bench`` parses the command line and calls these.
"""
