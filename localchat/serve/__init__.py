"""``localchat serve``: the engine's exact KV cache behind the OpenAI and Ollama APIs, for every
editor and app on the machine.

A front end like ``tui`` and ``ask``: it consumes the engine (one turn at a time, read as the
event vocabulary of ``localchat.events``) and nothing below imports it. Modules, from the socket
inwards:

- ``listener``: the listening sockets and the accept loop, within the file limit (the longest
  idle connection closed at the cap, a backoff when accept runs out of files, said once);
- ``http``: HTTP/1.1 on asyncio streams, requests read by h11, with the limits a local server
  needs (deadlines for a request's head and body, a body cap, disconnects seen at once);
- ``safety``: the gate every request passes (Host, Origin/CORS, the API key);
- ``app``: the gate, then the route; the listening loop and its shutdown;
- ``routes``: what each path answers, and which API's shape its errors take;
- ``respond``: the way back to one client (a whole answer or a stream, with its CORS headers);
- ``exchange``: one chat request run as a job, its reply streamed or gathered in an API's shape;
- ``openai_api`` and ``ollama_api``: each API's shapes only (request fields -> ``ChatRequest``,
  reply pieces and ending -> bytes, errors -> bodies, model listings);
- ``openai_completions``, ``infill_api`` and ``ollama_generate``: completions (``/v1/completions``,
  llama-server's ``/infill``, ``/api/generate``), their shapes only; ``prompt_tokens``: their
  prompts as tokens, fill-in-the-middle laid with the model's own FIM tokens;
- ``chat_request``: a chat request as the engine takes it, and the table of sampling fields
  both APIs read; ``fields``: the JSON checks (400s name the field); ``request_messages`` and
  ``tool_fields``: the messages, tools, tool calls and answer formats of both APIs;
  ``shape_fields``: llama-server's ``grammar`` and ``json_schema`` beside ``response_format``;
  ``logprob_fields``: OpenAI's ``logprobs`` in and out;
- ``pieces``: a job's events as text pieces, stop strings applied, one ending; ``call_checks``:
  which of a reply's calls a client can run (the rest is text);
- ``scheduler``: the queue that runs requests in arrival order on the engine's thread;
- ``model_host``: which models are served (``aliases``: other names for the first; ``digests``:
  each file's sha256) and the one loaded, with its state pool
  (``engine.state_pool``: every conversation's cache found again however they interleave);
- ``http_errors``: every error the server answers with, in one hierarchy.
"""
