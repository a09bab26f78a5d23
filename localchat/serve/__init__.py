"""``localchat serve``: the engine's exact KV cache behind the OpenAI and Ollama APIs, for every
editor and app on the machine.

A front end like ``tui`` and ``ask``: it consumes the engine (one turn at a time, read as the
event vocabulary of ``localchat.events``) and nothing below imports it. Modules, from the socket
inwards:

- ``http``: HTTP/1.1 on asyncio streams, with the limits a local server needs (deadlines for a
  request's head and body, a body cap, disconnects seen at once);
- ``safety``: the gate every request passes (Host, Origin/CORS, the API key);
- ``app``: the routes, the error shapes, the listening loop and its shutdown;
- ``openai_api`` and ``ollama_api``: each API's request fields and answer shapes;
- ``request``: the checks that turn a client's JSON into a ``ChatRequest`` (400s name the field);
- ``reply``: a job's events as text pieces, stop strings applied, one ending;
- ``scheduler``: the queue that runs requests in arrival order on the engine's thread;
- ``models``: which models are served and the one loaded, with its state pool
  (``engine.state_pool``: every conversation's cache found again however they interleave).
"""
