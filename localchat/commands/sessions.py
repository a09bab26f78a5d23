"""``localchat sessions``: list the stored conversations (``--json`` for scripts).

``--prune`` deletes the sessions' saved KV caches (they are rebuilt by prefilling when reopened)
and stored pictures no session uses (left by a turn that was never committed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from localchat.store import SessionRecord, Store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sessions",
        help="list saved chat sessions",
        description="List saved chat sessions, most recently used first. "
        "Open one with `localchat --session ID` (or its name) or the last one with "
        "`localchat --continue`.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per session")
    parser.add_argument("--prune", action="store_true",
                        help="delete every saved KV cache and half-written snapshot file "
                        "(sessions then reopen by prefilling once)")
    parser.add_argument("--search", metavar="TEXT",
                        help="list the messages of every session that contain all these words")
    parser.add_argument("--export", metavar="SESSION",
                        help="print the session with this id or name as Markdown (JSON with --json)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.prune:
        return _prune()
    with Store.open(read_only=True) as store:  # works on a full disk or a read-only home
        if args.export is not None:
            return _export(store, args.export, args.json)
        if args.search is not None:
            return _search(store, args.search, args.json)
        sessions = store.list_sessions()
    if args.json:
        print_json(sessions, sys.stdout)
    else:
        print_table(sessions, sys.stdout)
    return 0


def _export(store: Store, ref: str, as_json: bool) -> int:
    from localchat.store import export

    session = store.resolve_session(ref)
    sys.stdout.write(export.to_json(store, session.id) if as_json else export.to_markdown(store, session.id))
    return 0


def _search(store: Store, text: str, as_json: bool) -> int:
    """Matches with their session's id and label; exit 1 when nothing matched (like grep)."""
    hits = store.search(text)
    labels = {s.id: s.label for s in store.list_sessions()}
    for hit in hits:
        if as_json:
            sys.stdout.write(json.dumps({"session": hit.session_id, "label": labels.get(hit.session_id),
                                         "seq": hit.seq, "role": hit.role, "snippet": hit.snippet,
                                         "created_at": hit.created_at}, ensure_ascii=False) + "\n")
        else:
            who = "you" if hit.role == "user" else "reply"
            snippet = _visible(" ".join(hit.snippet.split()))
            sys.stdout.write(f"{hit.session_id:>4}  {_visible(labels.get(hit.session_id, ''))[:32]:<32}  "
                             f"{who:<5}  {snippet}\n")
    if not hits and not as_json:
        sys.stderr.write(f"No message contains {text!r}.\n")
    return 0 if hits else 1


def _prune() -> int:
    from localchat import paths
    from localchat.engine.snapshot_file import SnapshotStore

    count, freed = SnapshotStore(paths.snapshots_dir()).prune()
    print(f"removed {count} saved context{'s' if count != 1 else ''} ({freed / 1e6:.1f} MB)")
    with Store.open() as store:  # pictures left by a turn that was never committed
        pictures = store.remove_unused_images()
    if pictures:
        print(f"removed {pictures} picture{'s' if pictures != 1 else ''} no session uses")
    return 0


def session_to_dict(session: SessionRecord) -> dict:
    return {
        "id": session.id,
        "name": session.name,
        "title": session.title,
        "label": session.label,
        "model": session.model,
        "turns": session.turn_count,
        "preview": session.preview,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
    }


def print_json(sessions: list[SessionRecord], out: TextIO) -> None:
    out.writelines(json.dumps(session_to_dict(session), ensure_ascii=False) + "\n" for session in sessions)


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
    print_columns(("ID", "SESSION", "TURNS", "MODEL", "LAST USED"), rows, out, max_widths={1: 48})


def print_columns(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], out: TextIO,
                  max_widths: dict[int, int] | None = None) -> None:
    """A plain text table: columns as wide as their widest cell (capped by ``max_widths``,
    longer cells cut with "…")."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for column, cap in (max_widths or {}).items():
        widths[column] = min(widths[column], cap)
    for row in [header, *rows]:
        cells = [cell if len(cell) <= w else cell[: w - 1] + "…" for cell, w in zip(row, widths)]
        out.write("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() + "\n")


def _visible(text: str) -> str:
    """One table cell: on one line wherever the table goes (a file keeps its layout too)."""
    from localchat.terminal import visible

    return visible(text.replace("\t", " "), newlines=False)


def _ago(timestamp: float, now: float | None = None) -> str:
    seconds = max(0.0, (now or time.time()) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"
