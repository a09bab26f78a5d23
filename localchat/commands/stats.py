"""``localchat stats``: p50/p95 of TTFT, TPOT, inter-token latency and cache reuse over the
stored local replies, per model (``--session`` for one session, ``--json`` for scripts)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stats", help="speed percentiles over stored replies, per model",
        description="p50 and p95 of time to first token, time per output token, inter-token "
        "latency and KV cache reuse over every stored local reply, per model.")
    parser.add_argument("--session", "-s", metavar="ID|NAME", help="only this session's replies")
    parser.add_argument("--json", action="store_true", help="one JSON object per model")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from localchat.commands.sessions import print_columns
    from localchat.store import Store
    from localchat.store.stats import model_stats

    with Store.open(read_only=True) as store:
        session = store.resolve_session(args.session).id if args.session else None
        stats = model_stats(store, session)
    if args.json:
        for row in stats:
            sys.stdout.write(json.dumps(row.to_dict()) + "\n")
        return 0
    if not stats:
        sys.stdout.write("No stored local replies yet.\n")
        return 0
    header = ("MODEL", "REPLIES", "TTFT ms p50/p95", "TPOT ms p50/p95", "ITL ms p50/p95", "REUSE % p50/p95")
    rows = [(s.model, str(s.turns), str(s.ttft_ms), str(s.tpot_ms), str(s.itl_ms), str(s.reuse_percent))
            for s in stats]
    print_columns(header, rows, sys.stdout)
    return 0
