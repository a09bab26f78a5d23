"""Escalation to a remote OpenAI-compatible model: opt-in, visible, never silent.

- ``settings``: the ``[remote]`` config section (off by default; the API key only in the env).
- ``client``: streaming chat completions as the same events a local turn produces.
- ``router``: rules that send a prompt to the remote before local generation.
- ``confidence``: the monitor that hands an unsure, looping or cut local reply to the remote.
- ``breaker``: stop sending automatic escalations to a server that keeps failing.
- ``escalate``: the per-turn orchestration the TUI, ``ask`` and ``bench`` use.

Nothing is imported here, so that importing the settings does not pull in httpx.
"""
