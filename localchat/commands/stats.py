"""``localchat stats``: per local model, the route share of its stored replies (answered locally,
escalated to the remote, fallen back) and p50/p95 of TTFT, TPOT (also p99 and its standard
deviation), inter-token latency and cache reuse over its local replies (``--session`` for one
session, ``--json`` for scripts)."""

from __future__ import annotations

import argparse
import json
import sys

TIMID_ROUTER_HINT = ("With a remote configured, a local hit rate above ~90% can mean the router is "
                     "too timid: hard prompts the remote would answer better stay local (see "
                     "[remote.router] rule_score and `localchat bench --router`).")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stats", help="route share and speed percentiles over stored replies, per model",
        description="Per local model: how its stored replies were routed, as percentages "
        "local / escalated / fallback (LOCAL is the fast path's hit rate: answered without the "
        "remote; ESCALATED: answered by the remote, by the router or by /big; FALLBACK, the "
        "degrade rate: the remote was asked, failed, and the local reply stands), then p50 and "
        "p95 of time to first token, time per output token (also its p99 and standard "
        "deviation across replies, the jitter), inter-token latency and KV cache reuse over the "
        "local replies.",
        epilog=TIMID_ROUTER_HINT)
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
        sys.stdout.write("No stored replies yet.\n")
        return 0
    header = ("MODEL", "REPLIES", "LOCAL/ESC/FALLBACK %", "TTFT ms p50/p95", "TPOT ms p50/p95/p99",
              "TPOT SD ms", "ITL ms p50/p95", "REUSE % p50/p95")
    rows = [(s.model, str(s.routes.replies), str(s.routes),
             *((str(s.ttft_ms), str(s.tpot_ms), f"{s.tpot_ms.std:,.1f}", str(s.itl_ms), str(s.reuse_percent))
               if s.turns else ("-",) * 5))
            for s in stats]
    print_columns(header, rows, sys.stdout)
    return 0
