"""``localchat serve``: the OpenAI and Ollama APIs on this machine, over the local engine and its
exact cache (``localchat.serve``)."""

from __future__ import annotations

import argparse
import os
import sys

from localchat.errors import UserError

API_KEY_ENV = "LOCALCHAT_API_KEY"


def register(subparsers: argparse._SubParsersAction) -> None:
    from localchat.settings import SERVE_PORT

    p = subparsers.add_parser(
        "serve",
        help="serve the local model over the OpenAI and Ollama APIs",
        description="Serve downloaded models over the OpenAI API (/v1) and the Ollama API (/api) "
        "on this machine, with the engine's exact KV cache across interleaved conversations. "
        "Defaults come from config.toml's [serve]. Ctrl+C or SIGTERM stops it.",
    )
    p.add_argument("--model", "-m", help="the model to load first and serve under its name "
                   "(registry name, hf:ORG/REPO/FILE.gguf or a .gguf path; default: default_model)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, help=f"port (default {SERVE_PORT}; 0 picks a free one, printed at start)")
    p.add_argument("--api-key", help=f"require Authorization: Bearer KEY (also ${API_KEY_ENV})")
    p.add_argument("--cache-ram", type=int, metavar="MiB",
                   help="RAM for saved conversation states (default 2048; 0: the live one only)")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="a browser origin allowed to call the API (repeatable)")
    p.add_argument("--alias", action="append", metavar="NAME",
                   help="another name the served model answers to, for tools that hard-code "
                   "one (gpt-3.5-turbo, llama3); repeatable")
    p.add_argument("--parallel", "-np", type=int, metavar="N",
                   help="requests answered at once, decoded together in one context that they "
                   "share (default 4; 1: one at a time)")
    p.add_argument("--max-queue", type=int, metavar="N",
                   help="requests that may wait behind the running ones (default 64); more get 503")
    p.add_argument("--n-ctx", type=int, help="context size in tokens (default: the model's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from localchat import logs
    from localchat.serve.app import ServeApp, ServeOptions
    from localchat.serve.safety import exposure_warning
    from localchat.settings import check_flag, load_config

    for flag, dotted, value in (("--port", "serve.port", args.port),
                                ("--cache-ram", "serve.cache_ram_mib", args.cache_ram),
                                ("--max-queue", "serve.max_queue", args.max_queue),
                                ("--parallel", "serve.parallel", args.parallel)):
        check_flag(flag, dotted, value)
    config = load_config()
    options = ServeOptions.from_settings(
        config.serve, host=args.host, port=args.port, max_queue=args.max_queue,
        api_key=_api_key(args), cors_origins=args.cors_origin)
    # A failure nobody foresaw keeps its traceback in the log file, never on the terminal (the
    # asyncio loop's own reports included).
    logs.attach()
    logs.route("asyncio")
    host = _model_host(args, config)
    app = ServeApp(host, options)
    warning = exposure_warning(options.host, app.gate.has_key)
    if warning:
        print(f"localchat: warning: {warning}", file=sys.stderr)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, app.stop)
        try:
            await app.run(on_ready=_announce)
        except OSError as exc:
            raise UserError(f"cannot listen on {options.host}:{options.port}: "
                            f"{exc.strerror or exc} (another server on that port? try --port)") from None

    try:
        asyncio.run(main())
    finally:
        host.close()
    print("localchat serve: stopped", file=sys.stderr)
    return 0


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key or $LOCALCHAT_API_KEY; UserError for one no client could send
    (the server would start and answer every request 401)."""
    from localchat.serve.safety import key_problem

    source, key = (("--api-key", args.api_key) if args.api_key
                   else (API_KEY_ENV, os.environ.get(API_KEY_ENV)))
    problem = key_problem(key) if key else None
    if problem:
        raise UserError(f"{source} {problem}")
    return key or None


def _model_host(args: argparse.Namespace, config):
    """The served models, with the first one loaded (so the first request does not wait)."""
    from localchat.models.registry import require_local, resolve_model
    from localchat.serve.http_errors import ApiError
    from localchat.serve.model_host import ModelHost

    pinned = None
    if args.model:
        pinned = resolve_model(args.model)
        if pinned.is_embedding:
            raise UserError(f"{pinned.name} is an embedding model; give --model a chat model "
                            "(embedding models are served beside it, by name)")
        require_local(pinned)
    cache_mib = args.cache_ram if args.cache_ram is not None else config.serve.cache_ram_mib
    aliases = tuple(args.alias or config.serve.aliases)
    host = ModelHost(config, pinned, n_ctx=args.n_ctx, cache_bytes=cache_mib * 1024**2,
                     aliases=aliases, parallel=args.parallel)
    try:
        first = host.default()
    except ApiError as exc:
        raise UserError(exc.message) from None
    host.acquire(first)
    return host


def _announce(app) -> None:
    host = app.host
    url = app.base_url
    loaded = host.loaded
    names = [m.name + (f" (loaded, n_ctx {host.engine.n_ctx})" if m == loaded and host.engine else "")
             + (f", also as {', '.join(host.aliases.names)}"
                if host.aliases and m.name == host.aliases.target else "")
             for m in host.catalogue]
    cache = host.pool.cap_bytes // 1024**2
    print(f"localchat serve: {url}\n"
          f"  OpenAI API  {url}/v1  (GET /v1/models, POST /v1/chat/completions, /v1/completions, "
          "/v1/embeddings)\n"
          f"  Ollama API  {url}  (POST /api/chat, /api/generate, /api/embed, GET /api/tags, "
          "/api/ps, POST /api/show)\n"
          f"  editors     {url}/infill  (llama-server's fill-in-the-middle, on a model with FIM "
          "tokens)\n"
          f"  models      {', '.join(names)}\n"
          f"  slots       {host.parallel} requests at once, decoded together\n"
          f"  cache       {cache} MiB of saved conversation states in RAM; Ctrl+C stops",
          flush=True)
