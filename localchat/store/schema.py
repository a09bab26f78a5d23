"""The session database's schema, as a list of upgrade steps keyed on ``PRAGMA user_version``.

``UPGRADES[n]`` takes a database at version ``n`` to version ``n + 1``. A new release that needs a
schema change appends one small step here and never edits an old one: a user's database may be at
any earlier version, and each step must apply cleanly to exactly the state the previous step left.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from localchat.errors import UserError

UpgradeStep = Callable[[sqlite3.Connection], None]


def _v1_sessions_and_turns(db: sqlite3.Connection) -> None:
    """Sessions, their turns (one row per message), and a small key/value table for settings."""
    db.execute(
        """
        CREATE TABLE sessions (
            id          INTEGER PRIMARY KEY,
            name        TEXT UNIQUE,              -- chosen by the user (--session, /rename); NULL if none
            title       TEXT NOT NULL DEFAULT '', -- derived from the first message
            system      TEXT NOT NULL DEFAULT '', -- system prompt
            summary     TEXT NOT NULL DEFAULT '', -- running summary of trimmed turns
            model       TEXT NOT NULL DEFAULT '', -- model last used in this session
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL             -- last use; the sidebar sorts by it
        )
        """
    )
    db.execute(
        """
        CREATE TABLE turns (
            id            INTEGER PRIMARY KEY,
            session_id    INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq           INTEGER NOT NULL,        -- order within the session
            role          TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content       TEXT NOT NULL,
            model         TEXT NOT NULL DEFAULT '', -- which model answered (assistant turns)
            timings       TEXT,                     -- localchat.events.Timings as JSON
            route         TEXT NOT NULL DEFAULT '', -- 'local' or 'remote'
            route_reason  TEXT NOT NULL DEFAULT '',
            finish_reason TEXT NOT NULL DEFAULT '', -- 'stop', 'length', 'aborted'
            stopped       INTEGER NOT NULL DEFAULT 0, -- the user stopped this reply
            created_at    REAL NOT NULL,
            UNIQUE (session_id, seq)
        )
        """
    )
    db.execute("CREATE INDEX sessions_by_last_use ON sessions (updated_at DESC)")
    db.execute("CREATE INDEX turns_by_role_and_time ON turns (role, created_at DESC)")
    db.execute("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


def _v2_system_prompt_history(db: sqlite3.Connection) -> None:
    """When each system prompt took effect, so an export shows a prompt set mid-way where it was
    set. A session's existing prompt is recorded as applying from the start (the best we know)."""
    db.execute(
        """
        CREATE TABLE system_changes (
            id          INTEGER PRIMARY KEY,
            session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            after_seq   INTEGER NOT NULL,         -- applies to the turns after this seq (0: all)
            system      TEXT NOT NULL,
            created_at  REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX system_changes_by_session ON system_changes (session_id, id)")
    db.execute(
        "INSERT INTO system_changes (session_id, after_seq, system, created_at) "
        "SELECT id, 0, system, created_at FROM sessions WHERE system != ''"
    )


def _v3_message_search(db: sqlite3.Connection) -> None:
    """Full-text search over every message (``/search``, ``localchat sessions --search``): an
    FTS5 index over ``turns.content`` kept in step by triggers, built once for existing turns."""
    db.execute("CREATE VIRTUAL TABLE turns_fts USING fts5(content, content='turns', content_rowid='id')")
    db.execute(
        "CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN "
        "INSERT INTO turns_fts (rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute(
        "CREATE TRIGGER turns_fts_delete AFTER DELETE ON turns BEGIN "
        "INSERT INTO turns_fts (turns_fts, rowid, content) VALUES ('delete', old.id, old.content); END"
    )
    db.execute(
        "CREATE TRIGGER turns_fts_update AFTER UPDATE OF content ON turns BEGIN "
        "INSERT INTO turns_fts (turns_fts, rowid, content) VALUES ('delete', old.id, old.content); "
        "INSERT INTO turns_fts (rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute("INSERT INTO turns_fts (turns_fts) VALUES ('rebuild')")


def _v4_branches(db: sqlite3.Connection) -> None:
    """Branches left behind by an edit or a /retry: the turns from ``fork_seq`` on as they were,
    as JSON rows of ``turns``. The ``turns`` table stays the branch on screen, which is what
    every reader (the model's history, search, export, ``ask --session``) means by the session."""
    db.execute(
        """
        CREATE TABLE branches (
            id          INTEGER PRIMARY KEY,
            session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            fork_seq    INTEGER NOT NULL,   -- the first turn that differs from the branch on screen
            turns       TEXT NOT NULL,      -- JSON list of the branch's turn rows from fork_seq on
            created_at  REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX branches_by_fork ON branches (session_id, fork_seq, id)")


def _v5_route_outcome(db: sqlite3.Connection) -> None:
    """Which local model was in charge of each reply, and whether an escalation failed and fell
    back to it (``localchat stats``' route share: the router works for the local model, and a
    remote reply's ``model`` names the remote one). Existing replies get the best we know: a local
    reply's own model; a remote one, the model of the session's latest local reply before it; a
    fallback, from the reason the escalator has always written for one."""
    db.execute("ALTER TABLE turns ADD COLUMN local_model TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE turns ADD COLUMN fell_back INTEGER NOT NULL DEFAULT 0")
    db.execute("UPDATE turns SET local_model = model WHERE role = 'assistant' AND route != 'remote'")
    db.execute(
        "UPDATE turns SET local_model = COALESCE((SELECT l.model FROM turns l "
        "WHERE l.session_id = turns.session_id AND l.seq < turns.seq AND l.role = 'assistant' "
        "AND l.route != 'remote' ORDER BY l.seq DESC LIMIT 1), '') "
        "WHERE role = 'assistant' AND route = 'remote'"
    )
    db.execute("UPDATE turns SET fell_back = 1 WHERE role = 'assistant' AND route = 'local' "
               "AND route_reason LIKE 'fallback:%'")


_V5_TURN_COLUMNS = ("id, session_id, seq, role, content, model, timings, route, route_reason, "
                    "finish_reason, stopped, created_at, local_model, fell_back")


def _v6_tool_rounds(db: sqlite3.Connection) -> None:
    """Tool rounds (issue 40): a reply's calls (``tool_calls``: JSON list of ``{"id", "name",
    "arguments", "problem", "raw"}``) and each result as a turn of role 'tool' (``tool_call_id``,
    ``tool_name``, and ``tool_result``: JSON ``{"label", "is_error", "notice", "elapsed_ms"}``).
    SQLite cannot widen a CHECK in place, so ``turns`` is rebuilt with every row, id and trigger
    as it was (the full-text index refers to rows by id, which stay)."""
    for trigger in ("turns_fts_insert", "turns_fts_delete", "turns_fts_update"):
        db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    db.execute(
        """
        CREATE TABLE turns_v6 (
            id            INTEGER PRIMARY KEY,
            session_id    INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq           INTEGER NOT NULL,
            role          TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
            content       TEXT NOT NULL,
            model         TEXT NOT NULL DEFAULT '',
            timings       TEXT,
            route         TEXT NOT NULL DEFAULT '',
            route_reason  TEXT NOT NULL DEFAULT '',
            finish_reason TEXT NOT NULL DEFAULT '',
            stopped       INTEGER NOT NULL DEFAULT 0,
            created_at    REAL NOT NULL,
            local_model   TEXT NOT NULL DEFAULT '',
            fell_back     INTEGER NOT NULL DEFAULT 0,
            tool_calls    TEXT,                      -- an assistant turn's calls, as JSON
            tool_call_id  TEXT NOT NULL DEFAULT '',  -- a tool turn: the call it answers
            tool_name     TEXT NOT NULL DEFAULT '',
            tool_result   TEXT,                      -- a tool turn: how it went, as JSON
            UNIQUE (session_id, seq)
        )
        """
    )
    db.execute(f"INSERT INTO turns_v6 ({_V5_TURN_COLUMNS}) SELECT {_V5_TURN_COLUMNS} FROM turns")
    db.execute("DROP TABLE turns")
    db.execute("ALTER TABLE turns_v6 RENAME TO turns")
    db.execute("CREATE INDEX turns_by_role_and_time ON turns (role, created_at DESC)")
    db.execute(
        "CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN "
        "INSERT INTO turns_fts (rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute(
        "CREATE TRIGGER turns_fts_delete AFTER DELETE ON turns BEGIN "
        "INSERT INTO turns_fts (turns_fts, rowid, content) VALUES ('delete', old.id, old.content); END"
    )
    db.execute(
        "CREATE TRIGGER turns_fts_update AFTER UPDATE OF content ON turns BEGIN "
        "INSERT INTO turns_fts (turns_fts, rowid, content) VALUES ('delete', old.id, old.content); "
        "INSERT INTO turns_fts (rowid, content) VALUES (new.id, new.content); END"
    )


def _v7_images(db: sqlite3.Connection) -> None:
    """Pictures of user turns (issue 47): ``images``, a JSON list of ``{"sha256", "name",
    "format", "width", "height"}``; the bytes are files named by their SHA-256 beside the
    database (``store.images``), written before the turn that names them."""
    db.execute("ALTER TABLE turns ADD COLUMN images TEXT")


UPGRADES: list[UpgradeStep] = [_v1_sessions_and_turns, _v2_system_prompt_history, _v3_message_search,
                               _v4_branches, _v5_route_outcome, _v6_tool_rounds, _v7_images]


def latest_version() -> int:
    return len(UPGRADES)


def upgrade(db: sqlite3.Connection, steps: list[UpgradeStep] | None = None) -> int:
    """Bring ``db`` to the latest schema version and return that version.

    ``db`` must be in autocommit mode (``isolation_level=None``). All pending steps run in one
    ``BEGIN IMMEDIATE`` transaction: two processes opening a fresh database at once cannot both
    upgrade it, and a step that fails leaves the database at its old version, untouched.
    Raises ``UserError`` for a database written by a newer localchat.
    """
    steps = UPGRADES if steps is None else steps
    db.execute("BEGIN IMMEDIATE")
    try:
        # Read the version inside the write lock: another process may have just upgraded it.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(steps):
            raise UserError(
                f"The session database is at schema version {version}, but this localchat only "
                f"knows up to {len(steps)}. Upgrade localchat, or point LOCALCHAT_HOME elsewhere."
            )
        for step in steps[version:]:
            step(db)
        # PRAGMA does not take parameters; the value is an int we computed.
        db.execute(f"PRAGMA user_version = {len(steps)}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return len(steps)
