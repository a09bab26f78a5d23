"""``localchat bench``: the command line of the measurements in :mod:`localchat.bench` — which
mode, which model and sizes, JSON or text. What is measured, the targets and the printing live
there; imports stay inside ``run`` so that ``localchat --help`` loads none of it."""

from __future__ import annotations

import argparse
from pathlib import Path

from localchat.errors import UsageError, UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="replay a conversation and report TTFT, TPOT, cache reuse and stop latency",
        description="Replays a multi-turn conversation with greedy decoding on one loaded model "
        "and prints per-turn timings, a summary, and how the numbers compare with a fresh context "
        "per turn (--baseline) and with llama.cpp's raw decode loop.",
    )
    p.add_argument("--model", "-m", help="registry name, hf:ORG/REPO/FILE.gguf or a .gguf path")
    p.add_argument("--script", type=Path, help='JSONL file of {"role": "system"|"user", "content": ...}')
    p.add_argument("--turns", type=int, help="number of user turns (cycles the built-in script)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context size (default 4096)")
    p.add_argument("--max-tokens", type=int,
                   help="reply length per turn (default 48; with --router, 128)")
    p.add_argument("--gpu-layers", help="auto, all or a number of layers (default: config)")
    p.add_argument("--baseline", action="store_true",
                   help="also replay each turn on a fresh context (a stateless server)")
    p.add_argument("--no-abort", action="store_true", help="skip the stop-latency measurements")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--images", action="store_true",
                      help="a picture (the model's own colour-words projector, written here) "
                      "asked about, then followed up, then reopened from a snapshot: pictures "
                      "encoded, tokens prefilled, reuse, restored TTFT against warm; --rounds N")
    mode.add_argument("--restore", action="store_true",
                      help="measure reopening a ~2,000-token session in a new process (KV snapshot) "
                      "against the same turn in a process that never closed it")
    mode.add_argument("--tui", nargs="?", const=0, type=int, metavar="N_TOKENS",
                      help="measure what streaming N tokens through the running app costs against "
                      "the engine alone, keypress latency during streaming, and how steadily "
                      "frames come (also with llama.cpp on one thread, and for two scripted "
                      "~2,200-token replies: one paragraph, many Markdown blocks); default 1000 "
                      "tokens (400 with --pty)")
    mode.add_argument("--typing", nargs="?", const=1.0, type=float, metavar="DELAY_S",
                      help="measure prefill while typing: TTFT of a ~1,000-token paste sent DELAY_S "
                      "(default 1) after pasting, against a 20-token message and against no prefill")
    mode.add_argument("--router", nargs="?", const="", metavar="PROMPTS.jsonl",
                      help="score escalation on a labelled prompt set (default: the shipped one): "
                      "the rules, then the whole route through the local model")
    mode.add_argument("--speculative", nargs="?", const="", metavar="SET.jsonl",
                      help="answer a prompt set (default: the shipped edit-style and prose "
                      "prompts) with speculative decoding off and on, interleaved: tokens/s "
                      "ratio, acceptance, exactness")
    mode.add_argument("--schema", nargs="?", const="", metavar="SET.jsonl",
                      help="answer a schema set (default: the shipped one) in its JSON shapes: "
                      "validity, tok/s against the same reply unconstrained, side by side with "
                      "llama-cpp-python's own response_format path on the same model")
    p.add_argument("--no-compare", action="store_true",
                   help="with --schema: skip llama-cpp-python's side")
    mode.add_argument("--tools", action="store_true",
                      help="tools (issue 40): TTFT with three MCP servers configured vs none, the "
                      "cache reused after a tool result, call end -> tool start and result -> "
                      "prefill start")
    mode.add_argument("--serve", action="store_true",
                      help="start `localchat serve` and llama-cpp-python's server on the model and "
                      "send both (and each --against server) the same interleaved conversations "
                      "through the OpenAI API: TTFT per turn, cached share, tokens/s; also what "
                      "HTTP adds over an in-process engine and 16 concurrent streams; with "
                      "--concurrent C, many clients at once instead")
    p.add_argument("--against", action="append", default=[], metavar="URL",
                   help="with --serve: another OpenAI-compatible server on the same model "
                   "(llama-server, Ollama), compared side by side (repeatable)")
    p.add_argument("--conversations", type=int,
                   help="with --serve: conversations interleaved (default 4)")
    p.add_argument("--clients", type=int,
                   help="with --serve: concurrent streaming clients (default 16)")
    p.add_argument("--concurrent", type=int, metavar="C",
                   help="with --serve: instead of the interleaved conversations, C chat clients "
                   "at once (--turns, default 3; --max-tokens, default 48) with typed completions "
                   "and an embeddings request among them, on `localchat serve --parallel C`, on "
                   "`--parallel 1` and on each --against server (llama-server -np C): TTFT p50/p90 "
                   "per kind, the chats' tokens/s together, one client alone, a completion while "
                   "3 chats stream; then alone: typed /infill requests (a model with FIM tokens) "
                   "and 64 inputs embedded, 3 rounds")
    p.add_argument("--spec-mode", choices=("auto", "ngram", "draft"),
                   help="with --speculative: what drafts (default: [engine] speculative, or auto)")
    p.add_argument("--draft-model", help="with --speculative: the draft model (registry name, "
                   "hf: reference or .gguf path)")
    p.add_argument("--rounds", type=int,
                   help="with --tools: rounds of each measurement (default 3); with "
                   "--speculative: answers per prompt each way; with --schema: answers "
                   "per schema each way; with --tui --pty: alternating ask and app replies "
                   "(default 2); with --serve: prompts answered in process and through serve "
                   "(default 8)")
    p.add_argument("--no-exact", action="store_true",
                   help="with --speculative: skip answering the set again with bit-exact kernels "
                   "(flash attention on one CPU thread)")
    p.add_argument("--pty", nargs="?", const="pty", choices=("pty", "tmux"), metavar="TERMINAL",
                   help="with --tui: run the real app on a pseudo-terminal (or inside tmux on one) "
                   "so that the terminal's cost counts: decode against `ask`, keypresses, screen "
                   "updates (default 400 tokens)")
    p.add_argument("--rules-only", action="store_true",
                   help="with --router: score the rules alone, without running the local model")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="with --router: the local model's temperature (default 0, greedy)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localchat.bench import report
    from localchat.settings import check_flag, load_config

    check_flag("--max-tokens", "sampling.max_tokens", args.max_tokens)
    if args.concurrent is not None and not args.serve:
        raise UsageError("--concurrent goes with --serve")
    if args.router is not None:
        report.show(_router(args), args.json)
        return 0
    if args.rules_only:
        raise UserError("--rules-only goes with --router")
    if args.rounds is not None and args.rounds < 1:
        raise UserError(f"--rounds must be at least 1, not {args.rounds}")
    if args.speculative is not None:
        report.show(_speculative(args), args.json, text=_print_speculative)
        return 0
    if args.serve:
        report.show(_serve(args), args.json, text=_print_serve)
        return 0
    if args.against:
        raise UserError("--against goes with --serve")
    if args.schema is not None:
        report.show(_schema(args), args.json, text=_print_schema)
        return 0
    if args.tools:
        report.show(_tools(args), args.json, text=_print_tools)
        return 0
    if args.no_compare:
        raise UserError("--no-compare goes with --schema")
    if args.spec_mode or args.draft_model or args.no_exact:
        raise UserError("--spec-mode, --draft-model and --no-exact go with --speculative")
    if args.pty and args.tui is None:
        raise UserError("--pty goes with --tui")
    max_tokens = args.max_tokens or 48
    if args.restore or args.images or args.tui is not None or args.typing is not None:
        text = None if args.tui is None else report.print_pty if args.pty else report.print_tui
        if args.images:
            from localchat.bench.images import print_images

            text = print_images
        report.show(_with_model_path(args, max_tokens), args.json, text=text)
        return 0
    from localchat.bench.conversation import measure_conversation
    from localchat.bench.script import load_script

    system, users = load_script(args.script, args.turns)
    result = measure_conversation(
        args.model, load_config(), system, users, n_ctx=args.n_ctx, gpu_layers=_gpu_layers(args),
        max_tokens=max_tokens, baseline=args.baseline, stops=not args.no_abort,
        say=report.progress(enabled=not args.json))
    report.show(result, args.json, text=report.print_conversation)
    return 0


def _router(args: argparse.Namespace) -> dict:
    from localchat.bench.router import router_report
    from localchat.remote.router import LABELLED_PROMPTS
    from localchat.settings import check_flag, load_config

    check_flag("--temperature", "sampling.temperature", args.temperature)
    path = Path(args.router) if args.router else LABELLED_PROMPTS
    return router_report(path, args.model, load_config(), rules_only=args.rules_only,
                         n_ctx=args.n_ctx, gpu_layers=_gpu_layers(args),
                         temperature=args.temperature, max_tokens=args.max_tokens)


def _speculative(args: argparse.Namespace) -> dict:
    from localchat.bench import report
    from localchat.bench.speculative import measure_speculative, shipped_set
    from localchat.settings import load_config

    config = load_config()
    configured = config.engine.speculative
    mode = args.spec_mode or (configured if configured != "off" else "auto")
    path = Path(args.speculative) if args.speculative else shipped_set()
    return measure_speculative(args.model, config, path, mode=mode, draft_model=args.draft_model,
                               n_ctx=args.n_ctx, gpu_layers=_gpu_layers(args),
                               max_tokens=args.max_tokens or 160, rounds=args.rounds or 2,
                               say=report.progress(enabled=not args.json),
                               exact_pass=not args.no_exact)


def _schema(args: argparse.Namespace) -> dict:
    from localchat.bench import report
    from localchat.bench.schema import measure_schemas, shipped_set
    from localchat.models.registry import require_local, resolve_model
    from localchat.settings import load_config

    config = load_config()
    spec = resolve_model(args.model or config.default_model)
    path = Path(args.schema) if args.schema else shipped_set()
    return measure_schemas(require_local(spec), spec.name, path, n_ctx=args.n_ctx,
                           max_tokens=args.max_tokens or 400,
                           repeat_penalty=config.sampling.repeat_penalty, rounds=args.rounds or 2,
                           say=report.progress(enabled=not args.json),
                           compare=not args.no_compare)


def _tools(args: argparse.Namespace) -> dict:
    from localchat.bench import report
    from localchat.bench.tools import measure_tools
    from localchat.models.registry import require_local, resolve_model
    from localchat.settings import load_config

    spec = resolve_model(args.model or load_config().default_model)
    return measure_tools(require_local(spec), spec.name, n_ctx=args.n_ctx,
                         max_tokens=args.max_tokens or 32, rounds=args.rounds or 3,
                         say=report.progress(enabled=not args.json))


def _print_tools(result: dict) -> None:
    from localchat.bench.tools import print_tools

    print_tools(result)


def _print_schema(result: dict) -> None:
    from localchat.bench.schema import print_schemas

    print_schemas(result)


def _serve(args: argparse.Namespace) -> dict:
    from localchat.bench import report
    from localchat.bench.serve import measure_serve
    from localchat.settings import load_config

    if args.turns is not None and args.turns < 1:
        raise UserError(f"--turns must be at least 1, not {args.turns}")
    if args.concurrent is not None:
        return _serve_concurrent(args)
    conversations = 4 if args.conversations is None else args.conversations
    clients = 16 if args.clients is None else args.clients
    for flag, value in (("--conversations", conversations), ("--clients", clients)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    return measure_serve(args.model, load_config(), conversations=conversations,
                         turns=args.turns or 10, max_tokens=args.max_tokens or 32,
                         n_ctx=args.n_ctx, against=args.against, rounds=args.rounds or 8,
                         clients=clients, say=report.progress(enabled=not args.json))


def _serve_concurrent(args: argparse.Namespace) -> dict:
    from localchat.bench import report
    from localchat.bench.serve_concurrent import measure_concurrent
    from localchat.settings import load_config

    if args.concurrent < 2:
        raise UsageError(f"--concurrent must be at least 2 (it is compared with --parallel 1), "
                         f"not {args.concurrent}")
    for flag, value in (("--conversations", args.conversations), ("--clients", args.clients),
                        ("--rounds", args.rounds)):
        if value is not None:
            raise UsageError(f"{flag} goes with --serve without --concurrent")
    return measure_concurrent(args.model, load_config(), clients=args.concurrent,
                              turns=args.turns or 3, max_tokens=args.max_tokens or 48,
                              n_ctx=args.n_ctx, against=args.against,
                              say=report.progress(enabled=not args.json))


def _print_serve(result: dict) -> None:
    if "probe_streams" in result:  # --concurrent
        from localchat.bench.serve_concurrent_report import print_concurrent

        print_concurrent(result)
        return
    from localchat.bench.serve import print_serve

    print_serve(result)


def _print_speculative(result: dict) -> None:
    from localchat.bench.speculative import print_speculative

    print_speculative(result)


def _with_model_path(args: argparse.Namespace, max_tokens: int) -> dict:
    """--restore, --images, --typing and --tui, which load the model file themselves."""
    from localchat.models.registry import require_local, resolve_model
    from localchat.settings import load_config

    config = load_config()
    spec = resolve_model(args.model or config.default_model)
    path = require_local(spec)
    if args.images:
        from localchat.bench.images import measure_images

        return measure_images(path, spec.name, n_ctx=args.n_ctx, rounds=args.rounds or 3,
                              max_tokens=min(max_tokens, 16))
    if args.restore:
        from localchat.bench.restore import measure_restore

        return measure_restore(path, n_ctx=args.n_ctx, max_tokens=max_tokens)
    if args.typing is not None:
        from localchat.bench.typing_prefill import measure_typing_prefill

        return measure_typing_prefill(path, args.typing, n_ctx=args.n_ctx)
    if args.pty:
        from localchat.bench.pty_app import measure_pty

        return measure_pty(path, args.tui or 400, rounds=args.rounds or 2, terminal=args.pty)
    from localchat.bench.app import measure_streaming_overhead

    return measure_streaming_overhead(path, args.tui or 1000)


def _gpu_layers(args: argparse.Namespace) -> str | int | None:
    value = args.gpu_layers
    return int(value) if value is not None and value.isdigit() else value
