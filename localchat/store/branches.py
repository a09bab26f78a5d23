"""Edit and rewind: a session's conversation forks at a turn, and the turns it had from there on
stay reachable as a branch beside the new ones (←/→ on the message in the app).

The ``turns`` table always holds the branch on screen; the others wait in ``branches`` (one row
per branch: the turns from its fork on, as they were). Forking moves the tail into a new branch
row; switching swaps the tail on screen with a stored branch, in one transaction, so a crash
leaves one whole branch on screen and the others stored, never a mix.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from localchat.store.store import Store

_ROW = ("seq", "role", "content", "model", "timings", "route", "route_reason", "finish_reason",
        "stopped", "created_at", "local_model", "fell_back", "tool_calls", "tool_call_id",
        "tool_name", "tool_result", "images")
# Columns that branches stored before schema versions 5, 6 and 7 do not have.
_ADDED = {"local_model": "", "fell_back": 0, "tool_calls": None, "tool_call_id": "",
          "tool_name": "", "tool_result": None, "images": None}


@dataclass(frozen=True)
class Branches:
    """The versions of the conversation from turn ``fork_seq`` on, oldest first (by when their
    first turn was written), and which of them is on screen (0-based)."""

    fork_seq: int
    count: int
    current: int


def fork_points(store: Store, session_id: int) -> dict[int, Branches]:
    """Every turn of the session that has other versions, by seq."""
    seqs = store._read("SELECT DISTINCT fork_seq FROM branches WHERE session_id = ?", (session_id,))
    return {seq: branches_at(store, session_id, seq) for (seq,) in seqs}


def fork(store: Store, session_id: int, seq: int) -> int:
    """Move the turns from ``seq`` on into a stored branch; return its id (0 if there were none)."""
    with store._write() as db:
        return _stash(db, session_id, seq)


def branches_at(store: Store, session_id: int, seq: int) -> Branches:
    versions = _versions(store, session_id, seq)
    return Branches(seq, len(versions), [v[1] for v in versions].index(None))


def switch(store: Store, session_id: int, seq: int, step: int) -> bool:
    """Show the previous (-1) or next (+1) version from turn ``seq`` on; False if there is none."""
    with store._write() as db:
        versions = _versions(store, session_id, seq)
        target = [v[1] for v in versions].index(None) + step
        if len(versions) < 2 or not 0 <= target < len(versions):
            return False
        wanted = versions[target][1]
        stored = db.execute("SELECT turns FROM branches WHERE id = ?", (wanted,)).fetchone()[0]
        db.execute("DELETE FROM branches WHERE id = ?", (wanted,))
        _stash(db, session_id, seq)
        for turn in json.loads(stored):
            row = {**_ADDED, **turn}
            db.execute(f"INSERT INTO turns (session_id, {', '.join(_ROW)}) VALUES (?{', ?' * len(_ROW)})",
                       (session_id, *[row[k] for k in _ROW]))
        db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (time.time(), session_id))
    return True


def _versions(store: Store, session_id: int, seq: int) -> list[tuple[float, int | None]]:
    """(when its first turn was written, stored branch id or None for the one on screen), oldest first."""
    stored = store._read("SELECT created_at, id FROM branches WHERE session_id = ? AND fork_seq = ?",
                         (session_id, seq))
    screen = store._read("SELECT created_at FROM turns WHERE session_id = ? AND seq = ?", (session_id, seq))
    # An empty tail on screen (all of it moved away, nothing written yet) sorts last: it is newest.
    versions = [(r[0], r[1]) for r in stored] + [(screen[0][0] if screen else float("inf"), None)]
    return sorted(versions, key=lambda v: (v[0], v[1] is None))


def _stash(db, session_id: int, seq: int) -> int:
    rows = db.execute(f"SELECT {', '.join(_ROW)} FROM turns WHERE session_id = ? AND seq >= ? ORDER BY seq",
                      (session_id, seq)).fetchall()
    if not rows:
        return 0
    turns = [dict(zip(_ROW, r)) for r in rows]
    # created_at of the branch = of its first turn: the versions keep their order as they swap.
    cur = db.execute("INSERT INTO branches (session_id, fork_seq, turns, created_at) VALUES (?, ?, ?, ?)",
                     (session_id, seq, json.dumps(turns), turns[0]["created_at"]))
    db.execute("DELETE FROM turns WHERE session_id = ? AND seq >= ?", (session_id, seq))
    return cur.lastrowid
