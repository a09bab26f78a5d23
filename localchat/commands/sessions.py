"""``localchat sessions``: list the stored conversations (``--json`` for scripts).

``--prune`` deletes the sessions' saved KV caches (they are rebuilt by prefilling when reopened).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from localchat.store import SessionRecord, Store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sessions",
        help="list saved chat sessions",
        description="List saved chat sessions, most recently used first. "
        "Open one with `localchat --session NAME` or the last one with `localchat --continue`.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per session")
    parser.add_argument("--prune", action="store_true",
                        help="delete every saved KV cache and half-written snapshot file "
                        "(sessions then reopen by prefilling once)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.prune:
        return _prune()
    with Store.open() as store:
        sessions = store.list_sessions()
    if args.json:
        print_json(sessions, sys.stdout)
    else:
        print_table(sessions, sys.stdout)
    return 0


def _prune() -> int:
    from localchat import paths
    from localchat.store.snapshots import SnapshotStore

    count, freed = SnapshotStore(paths.snapshots_dir()).prune()
    print(f"removed {count} saved context{'s' if count != 1 else ''} ({freed / 1e6:.1f} MB)")
    return 0


def session_to_dict(session: SessionRecord) -> dict:
    return {
        "id": session.id,
        "name": session.name,
        "title": session.title,
        "label": session.label,
        "model": session.model,
        "turns": session.turn_count,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
    }


def print_json(sessions: list[SessionRecord], out: TextIO) -> None:
    for session in sessions:
        out.write(json.dumps(session_to_dict(session), ensure_ascii=False) + "\n")


def print_table(sessions: list[SessionRecord], out: TextIO) -> None:
    if not sessions:
        out.write("No sessions yet. Run `localchat` to start one.\n")
        return
    # Names and titles come from users and prompts: escape sequences in them must not retitle
    # or clear the terminal, and newlines must not break the table.
    rows = [
        (str(s.id), _visible(s.label), str(s.turn_count), _visible(s.model) or "-", _ago(s.updated_at))
        for s in sessions
    ]
    header = ("ID", "SESSION", "TURNS", "MODEL", "LAST USED")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    widths[1] = min(widths[1], 48)
    for row in [header, *rows]:
        cells = [cell if len(cell) <= w else cell[: w - 1] + "…" for cell, w in zip(row, widths)]
        out.write("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() + "\n")


def _visible(text: str) -> str:
    from localchat.commands.ask import neutralise_controls

    return neutralise_controls(text).replace("\n", "^J").replace("\t", " ")


def _ago(timestamp: float, now: float | None = None) -> str:
    seconds = max(0.0, (now or time.time()) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"
