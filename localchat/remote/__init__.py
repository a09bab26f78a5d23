"""Escalation to a remote OpenAI-compatible model: opt-in, visible, never silent.

- ``client``: streaming chat completions as the same events a local turn produces.
- ``router``: rules that send a prompt to the remote before local generation.
- ``confidence``: the monitor that hands an unsure, looping or cut local reply to the remote.
- ``breaker``: stop sending automatic escalations to a server that keeps failing.
- ``escalate``: the per-turn orchestration the TUI, ``ask`` and ``bench`` use.

Its settings, the ``[remote]`` config section (off by default; the API key only in the env), are
``localchat.settings.remote``: the schema lives at the bottom with the other sections.

Nothing is imported here, so that importing the package does not pull in httpx.
"""
