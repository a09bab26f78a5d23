"""SQLite store for sessions and their turns, shared by the app and the command-line tools.

Durability: every write is its own committed transaction, so a finished turn is on disk the
moment ``add_reply`` returns and a ``kill -9`` mid-reply loses at most the reply in flight.
WAL mode with ``synchronous=NORMAL`` survives a crash of the process (not of the OS, which may
lose the last commits; that trade buys commits without an fsync each).

Concurrency: the app and a CLI command (``localchat ask --session``) may write the same file at
once. Writes take the lock up front (``BEGIN IMMEDIATE``) so that waiting uses ``busy_timeout``
instead of failing on a lock upgrade. Commands that only read open the file read-only. One ``Store`` may be shared by threads: calls are
serialised by a lock (the app commits replies from its generation thread).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localchat.errors import UserError
from localchat.events import Timings
from localchat.names import check_name
from localchat.paths import database_file
from localchat.reply.calls import ToolCall, ToolResult
from localchat.store.connect import StoreError, connect_read_only
from localchat.store.connect import connect as _connect
from localchat.store.connect import describe as _describe
from localchat.store.images import ImageFile
from localchat.store.images import images_dir as _images_dir
from localchat.store.images import load as _load_image
from localchat.store.images import names_in as _image_names
from localchat.store.images import remove_unused as _remove_unused_images
from localchat.store.images import save as _save_image
from localchat.store.records import (
    ImageRef,
    SearchHit,
    SessionRecord,
    TurnRecord,
    calls_from_json,
    calls_to_json,
    images_from_json,
    images_to_json,
    timings_from_json,
    timings_to_json,
    title_from_prompt,
)
from localchat.store.schema import latest_version, upgrade

BUSY_TIMEOUT_MS = 5000


class SessionNotFound(UserError):
    """A session was named or numbered that is not in the store."""


class NameTaken(UserError):
    """A session was renamed to a name another session already has."""


_SESSION_COLUMNS = (
    "s.id, s.name, s.title, s.system, s.summary, s.model, s.created_at, s.updated_at, "
    "(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id), "
    # Only the start of the newest message: the sidebar previews its first line.
    "COALESCE((SELECT substr(t.content, 1, 500) FROM turns t WHERE t.session_id = s.id "
    "ORDER BY t.seq DESC LIMIT 1), '')"
)
_TURN_COLUMNS = (
    "id, session_id, seq, role, content, model, timings, route, route_reason, finish_reason, "
    "stopped, created_at, local_model, fell_back, tool_calls, tool_call_id, tool_name, tool_result, "
    "images"
)


def _open_current(path: Path) -> sqlite3.Connection | None:
    """A read-only connection to ``path`` if it is a database at this localchat's schema
    version, else None: a missing or older one is created or upgraded the read-write way, and a
    newer one is refused there by ``upgrade``."""
    if not path.is_file():
        return None
    try:
        db = connect_read_only(path)
    except StoreError:
        return None
    try:
        if db.execute("PRAGMA user_version").fetchone()[0] == latest_version():
            return db
    except sqlite3.Error:
        pass
    db.close()
    return None


def _session(row: tuple) -> SessionRecord:
    return SessionRecord(*row)


def _turn(row: tuple) -> TurnRecord:
    (turn_id, session_id, seq, role, content, model, timings, route, reason, finish, stopped, created,
     local_model, fell_back, tool_calls, tool_call_id, tool_name, tool_result, images) = row
    outcome = json.loads(tool_result) if tool_result else {}
    return TurnRecord(turn_id, session_id, seq, role, content, model, timings_from_json(timings),
                      route, reason, finish, bool(stopped), created, local_model, bool(fell_back),
                      calls_from_json(tool_calls), tool_call_id, tool_name,
                      str(outcome.get("label", "")), bool(outcome.get("is_error", False)),
                      str(outcome.get("notice", "")), float(outcome.get("elapsed_ms", 0.0)),
                      images_from_json(images))


def _inserted_id(cursor: sqlite3.Cursor) -> int:
    assert cursor.lastrowid is not None  # set by every INSERT
    return cursor.lastrowid


class Store:
    """Sessions and turns in one SQLite file. Open with ``Store.open()``; close when done."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._writing = False
        reader = _open_current(path) if read_only else None
        self.read_only = reader is not None  # then nothing is written, not even the WAL setup
        self._db = reader or _connect(path)
        try:
            with self._readable_errors():
                self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                if self.read_only:
                    self.schema_version = latest_version()
                else:
                    self._set_wal()
                    self._db.execute("PRAGMA synchronous = NORMAL")
                    self._db.execute("PRAGMA foreign_keys = ON")
                    self.schema_version = upgrade(self._db)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open(cls, path: Path | None = None, *, read_only: bool = False) -> Store:
        """Open (creating and upgrading as needed) the store at ``path`` or the data dir's default.
        ``read_only``: for commands that only read (they then work on a full disk or a read-only
        home); writes raise StoreError. A missing or older database is still created or upgraded."""
        return cls(path or database_file(), read_only=read_only)

    def _set_wal(self) -> None:
        """WAL mode. Switching a fresh database to it needs an exclusive lock, and SQLite does
        not wait for that one with the busy timeout when another connection of a process that
        opened the file at the same moment holds a write lock (it would risk a deadlock): it
        fails at once with "database is locked". So the switch itself is retried until the busy
        timeout has passed."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, schema_version={self.schema_version})"

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._readable_errors():
            if self._writing:  # nested in another write (add_exchange): part of its transaction
                yield self._db
                return
            self._writing = True
            try:
                with self._transaction():
                    yield self._db
            finally:
                self._writing = False

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (disk full, I/O error) has already rolled back; a second
            # ROLLBACK would replace the real cause with "no transaction is active".
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock, self._readable_errors():
            return self._db.execute(sql, params).fetchall()

    @contextmanager
    def _readable_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError:
            raise  # a constraint: the caller turns it into its own error
        except sqlite3.DatabaseError as exc:  # locked past busy_timeout, disk full, not a database
            raise StoreError(_describe(self.path, exc)) from None

    # --- sessions -------------------------------------------------------------------------

    def create_session(self, name: str | None = None, *, system: str = "", model: str = "") -> SessionRecord:
        """Create an empty session. Raises ``NameTaken`` if ``name`` is in use."""
        if name is not None:
            check_session_name(name)
        now = time.time()
        try:
            with self._write() as db:
                cur = db.execute(
                    "INSERT INTO sessions (name, system, model, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (name, system, model, now, now),
                )
        except sqlite3.IntegrityError:
            raise NameTaken(f"A session named {name!r} already exists.") from None
        return self.session(_inserted_id(cur))

    def session(self, session_id: int) -> SessionRecord:
        rows = self._read(f"SELECT {_SESSION_COLUMNS} FROM sessions s WHERE s.id = ?", (session_id,))
        if not rows:
            raise SessionNotFound(f"No session with id {session_id}.")
        return _session(rows[0])

    def find_session(self, name: str) -> SessionRecord | None:
        rows = self._read(f"SELECT {_SESSION_COLUMNS} FROM sessions s WHERE s.name = ?", (name,))
        return _session(rows[0]) if rows else None

    def open_named_session(self, name: str) -> SessionRecord:
        """The session called ``name``, created empty if there is none (``--session NAME``)."""
        check_session_name(name)
        found = self.find_session(name)
        if found:
            return found
        try:
            return self.create_session(name)
        except NameTaken:
            # Another process created it between our look-up and insert.
            return self.find_session(name) or self.create_session(name)

    def resolve_session(self, ref: str, *, create: bool = False) -> SessionRecord:
        """The session ``ref`` names: a session's name, else (all digits) its id; with ``create``
        a new name starts a session of that name. Raises ``SessionNotFound`` naming what to do."""
        found = self.find_session(ref)
        if found is not None:
            return found
        if ref.strip().isdigit():
            # A number means an id: "3" must not quietly start a new session called "3".
            return self.session(int(ref))
        if not create:
            raise SessionNotFound(f"No session named {ref!r}; `localchat sessions` lists them with their ids.")
        return self.open_named_session(ref)

    def start_or_resolve(self, ref: str) -> tuple[SessionRecord, bool]:
        """``resolve_session(ref, create=True)``, and whether this call started the session (its
        caller then removes it again if it stores nothing: see :meth:`forget_if_empty`)."""
        started = self.find_session(ref) is None and not ref.strip().isdigit()
        return self.resolve_session(ref, create=True), started

    def forget_if_empty(self, session_id: int) -> bool:
        """Delete the session if it has no turns (one started for a turn that was refused or
        failed), so that it is not listed; True if it was deleted. The caller holds the
        session's lock, so no turn of another process is on its way into it."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM turns WHERE session_id = ? LIMIT 1", (session_id,)).fetchone():
                return False
            return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

    def last_session(self) -> SessionRecord | None:
        """The most recently used session (``--continue``), or None if there are none."""
        rows = self._read(
            f"SELECT {_SESSION_COLUMNS} FROM sessions s ORDER BY s.updated_at DESC, s.id DESC LIMIT 1"
        )
        return _session(rows[0]) if rows else None

    def list_sessions(self) -> list[SessionRecord]:
        """All sessions, most recently used first."""
        rows = self._read(
            f"SELECT {_SESSION_COLUMNS} FROM sessions s ORDER BY s.updated_at DESC, s.id DESC"
        )
        return [_session(r) for r in rows]

    def rename_session(self, session_id: int, name: str) -> SessionRecord:
        """Give a session a name of the user's choice. Raises ``NameTaken`` or ``SessionNotFound``."""
        name = name.strip()
        check_session_name(name)
        try:
            self._update_session(session_id, "name = ?", (name,), touch=False)
        except sqlite3.IntegrityError:
            raise NameTaken(f"A session named {name!r} already exists.") from None
        return self.session(session_id)

    def delete_session(self, session_id: int) -> None:
        """Delete a session and all its turns (and the pictures no other session has)."""
        with self._write() as db:
            if db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                raise SessionNotFound(f"No session with id {session_id}.")
        self.remove_unused_images()

    def set_system(self, session_id: int, system: str) -> None:
        """Set the system prompt from the next turn on (recorded where it changed, for exports)."""
        with self._write() as db:
            self._update_session(session_id, "system = ?", (system,))
            db.execute(
                "INSERT INTO system_changes (session_id, after_seq, system, created_at) "
                "VALUES (?, (SELECT COALESCE(MAX(seq), 0) FROM turns WHERE session_id = ?), ?, ?)",
                (session_id, session_id, system, time.time()),
            )

    def system_history(self, session_id: int) -> list[tuple[int, str]]:
        """(after_seq, system prompt) for each change, oldest first: a prompt applies to the
        turns after ``after_seq``; only the last change at one seq counts."""
        rows = self._read("SELECT after_seq, system FROM system_changes WHERE session_id = ? ORDER BY id",
                          (session_id,))
        return [(seq, text) for seq, text in rows]

    def set_summary(self, session_id: int, summary: str) -> None:
        self._update_session(session_id, "summary = ?", (summary,), touch=False)

    def touch(self, session_id: int) -> None:
        """Mark a session as just used (it moves to the top of the sidebar)."""
        self._update_session(session_id, "", ())

    def _update_session(self, session_id: int, assignments: str, params: tuple, *, touch: bool = True) -> None:
        sets = [a for a in (assignments, "updated_at = ?" if touch else "") if a]
        values = params + ((time.time(),) if touch else ())
        with self._write() as db:
            cur = db.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*values, session_id))
            if cur.rowcount == 0:
                raise SessionNotFound(f"No session with id {session_id}.")

    # --- turns ----------------------------------------------------------------------------

    def add_user_turn(self, session_id: int, content: str,
                      images: Sequence[ImageFile] = ()) -> TurnRecord:
        """Record the user's prompt (before the reply starts, so a crash cannot lose it), with
        its pictures: their files are stored first (``store.images``), then the turn names them.

        The first prompt of an untitled session becomes its title.
        """
        for image in images:
            _save_image(self.path, image)
        refs = tuple(image.ref for image in images)
        with self._write() as db:
            turn_id, seq, now = self._insert_turn(db, session_id, "user", content,
                                                  images=images_to_json(refs))
            db.execute(
                "UPDATE sessions SET title = ? WHERE id = ? AND title = ''",
                (title_from_prompt(content), session_id),
            )
        return TurnRecord(turn_id, session_id, seq, "user", content, created_at=now, images=refs)

    def image_bytes(self, ref: ImageRef) -> bytes | None:
        """A stored picture's bytes (None: its file is gone)."""
        return _load_image(self.path, ref)

    def image_path(self, ref: ImageRef) -> Path:
        """Where a stored picture's copy is kept."""
        return _images_dir(self.path) / ref.file_name

    def remove_unused_images(self, grace_s: float | None = None) -> int:
        """Delete the stored pictures no turn and no branch names (see ``store.images``);
        return how many. A sweep that fails leaves the files for the next one."""
        if self.read_only:
            return 0
        try:
            turns = [r[0] for r in self._read("SELECT images FROM turns WHERE images IS NOT NULL")]
            branches = [r[0] for r in self._read("SELECT turns FROM branches WHERE turns LIKE '%sha256%'")]
        except UserError:
            return 0
        return _remove_unused_images(self.path, _image_names(turns, branches), grace_s)

    def add_exchange(self, session_id: int, prompt: str, reply: str, *, summary: str | None = None,
                     images: Sequence[ImageFile] = (), **reply_fields: Any) -> TurnRecord:
        """Record a prompt, its reply and (if given) the session's new summary in one
        transaction: all or nothing (a full disk must not leave a prompt whose reply the user
        saw but the store lost). ``reply_fields`` are ``add_reply``'s keywords."""
        with self._write():
            self.add_user_turn(session_id, prompt, images)
            turn = self.add_reply(session_id, reply, **reply_fields)
            if summary is not None:
                self.set_summary(session_id, summary)
            return turn

    def add_reply(
        self,
        session_id: int,
        content: str,
        *,
        model: str,
        timings: Timings | None = None,
        finish_reason: str = "stop",
        stopped: bool = False,
        route: str = "local",
        route_reason: str = "",
        local_model: str = "",
        fell_back: bool = False,
        tool_calls: tuple[ToolCall, ...] = (),
    ) -> TurnRecord:
        """Record a finished reply; ``stopped`` marks one the user cut short. ``local_model``: the
        local model in charge of the turn (by default ``model`` on the local route); ``fell_back``:
        the remote was asked and failed, so this local reply stands. Committed on return."""
        local_model = local_model or (model if route != "remote" else "")
        with self._write() as db:
            turn_id, seq, now = self._insert_turn(
                db, session_id, "assistant", content,
                model=model, timings=timings_to_json(timings), route=route,
                route_reason=route_reason, finish_reason=finish_reason, stopped=int(stopped),
                local_model=local_model, fell_back=int(fell_back),
                tool_calls=calls_to_json(tool_calls),
            )
            db.execute("UPDATE sessions SET model = ? WHERE id = ?", (model, session_id))
        return TurnRecord(
            turn_id, session_id, seq, "assistant", content, model, timings, route, route_reason,
            finish_reason, stopped, now, local_model, fell_back, tuple(tool_calls),
        )

    def add_tool_result(self, session_id: int, result: ToolResult, *, label: str = "",
                        elapsed_ms: float = 0.0) -> TurnRecord:
        """Record a tool's result (a ``tool`` turn after the reply that called it)."""
        outcome = {"label": label, "is_error": result.is_error, "notice": result.notice,
                   "elapsed_ms": round(elapsed_ms, 3)}
        with self._write() as db:
            turn_id, seq, now = self._insert_turn(
                db, session_id, "tool", result.content, tool_call_id=result.call_id,
                tool_name=result.name, tool_result=json.dumps(outcome, ensure_ascii=False))
        return TurnRecord(turn_id, session_id, seq, "tool", result.content, created_at=now,
                          tool_call_id=result.call_id, tool_name=result.name, tool_label=label,
                          is_error=result.is_error, notice=result.notice, elapsed_ms=elapsed_ms)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction around several writes (a tool round and its reply): all or none."""
        with self._write():
            yield

    def _insert_turn(self, db: sqlite3.Connection, session_id: int, role: str, content: str, **extra: object) -> tuple[int, int, float]:
        # Computed inside the write transaction, so concurrent writers cannot take the same seq.
        seq = db.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM turns WHERE session_id = ?", (session_id,)
        ).fetchone()[0]
        now = time.time()
        columns = ["session_id", "seq", "role", "content", "created_at", *extra]
        values = [session_id, seq, role, content, now, *extra.values()]
        try:
            cur = db.execute(
                f"INSERT INTO turns ({', '.join(columns)}) VALUES ({', '.join('?' * len(values))})",
                values,
            )
        except sqlite3.IntegrityError:
            raise SessionNotFound(f"No session with id {session_id}.") from None
        db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))
        return _inserted_id(cur), seq, now

    def turns(self, session_id: int) -> list[TurnRecord]:
        """A session's turns in order."""
        rows = self._read(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE session_id = ? ORDER BY seq", (session_id,)
        )
        return [_turn(r) for r in rows]

    def replies(self, session_id: int | None = None) -> list[TurnRecord]:
        """Every stored reply (of one session, or of all), in one query."""
        where, args = ("AND session_id = ? ", (session_id,)) if session_id is not None else ("", ())
        rows = self._read(f"SELECT {_TURN_COLUMNS} FROM turns WHERE role = 'assistant' {where}"
                          "ORDER BY session_id, seq", args)
        return [_turn(r) for r in rows]

    def clear_turns(self, session_id: int) -> None:
        """Forget a session's turns and summary; its name and system prompt stay."""
        with self._write() as db:
            db.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
            db.execute("UPDATE sessions SET summary = '', title = '' WHERE id = ?", (session_id,))
            # The prompt in force now applies from the (new) start.
            db.execute("DELETE FROM system_changes WHERE session_id = ?", (session_id,))
            db.execute(
                "INSERT INTO system_changes (session_id, after_seq, system, created_at) "
                "SELECT id, 0, system, ? FROM sessions WHERE id = ? AND system != ''",
                (time.time(), session_id),
            )
        self.remove_unused_images()

    def recent_prompts(self, limit: int = 200) -> list[str]:
        """The user's latest distinct prompts across all sessions, oldest first (input history)."""
        rows = self._read(
            "SELECT content FROM turns WHERE role = 'user' GROUP BY content "
            "ORDER BY MAX(created_at) DESC LIMIT ?",
            (limit,),
        )
        return [r[0] for r in reversed(rows)]

    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
        """Messages of any session containing every word of ``text`` (FTS5, prefix-free word
        match, case-insensitive), best matches first. Raises ``UserError`` for an empty query."""
        words = text.split()
        if not words:
            raise UserError("Search for what? Give at least one word.")
        # Each word quoted: the user's text is matched literally, never read as FTS5 syntax.
        query = " ".join('"' + w.replace('"', '""') + '"' for w in words)
        rows = self._read(
            "SELECT t.session_id, t.seq, t.role, snippet(turns_fts, 0, '', '', '…', 12), t.created_at "
            "FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid WHERE turns_fts MATCH ? "
            "ORDER BY rank LIMIT ?",
            (query, limit),
        )
        return [SearchHit(*row) for row in rows]

    # --- settings -------------------------------------------------------------------------

    def get_setting(self, key: str, default: str | None = None) -> str | None:
        rows = self._read("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0][0] if rows else default

    def set_setting(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )


def check_session_name(name: str) -> None:
    """Raise ``UserError`` for a name the sessions table and sidebar cannot show on one line (or
    that would show as another name: see localchat.names)."""
    check_name(name, "session name")
