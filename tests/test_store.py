"""The session store: schema upgrades, turns with their timings, durability and concurrent use."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from localchat.errors import UserError
from localchat.events import Timings
from localchat.store import NameTaken, SessionNotFound, Store, StoreError, schema


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "sessions.db") as s:
        yield s


def test_a_new_database_is_created_at_the_latest_schema_version_in_wal_mode(tmp_path: Path):
    with Store.open(tmp_path / "new.db") as store:
        assert store.schema_version == schema.latest_version()
    db = sqlite3.connect(tmp_path / "new.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.latest_version()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_default_location_is_the_data_dir(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    with Store.open() as store:
        assert store.path == tmp_path / "data" / "sessions.db"


def test_upgrade_steps_run_once_each_in_order(tmp_path: Path):
    ran: list[str] = []

    def add_tags(db: sqlite3.Connection) -> None:
        ran.append("v2")
        db.execute("ALTER TABLE sessions ADD COLUMN tags TEXT NOT NULL DEFAULT ''")

    path = tmp_path / "s.db"
    Store.open(path).close()  # at the latest version
    db = sqlite3.connect(path, isolation_level=None)
    latest = schema.latest_version()
    assert schema.upgrade(db, [*schema.UPGRADES, add_tags]) == latest + 1
    assert schema.upgrade(db, [*schema.UPGRADES, add_tags]) == latest + 1
    assert ran == ["v2"]
    assert "tags" in [c[1] for c in db.execute("PRAGMA table_info(sessions)")]


def test_a_failing_upgrade_step_leaves_the_database_at_its_old_version(tmp_path: Path):
    def broken(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE sessions ADD COLUMN tags TEXT")
        raise RuntimeError("step failed half way")

    path = tmp_path / "s.db"
    Store.open(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(RuntimeError):
        schema.upgrade(db, [*schema.UPGRADES, broken])
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.latest_version()
    assert "tags" not in [c[1] for c in db.execute("PRAGMA table_info(sessions)")]


def test_a_database_from_a_newer_localchat_is_refused_with_a_readable_error(tmp_path: Path):
    path = tmp_path / "s.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(UserError, match="schema version 99"):
        Store.open(path)


def test_turns_keep_their_order_model_timings_route_and_stopped_flag(store: Store):
    session = store.create_session()
    store.add_user_turn(session.id, "Write a haiku")
    timings = Timings(cache_n=12, prompt_n=30, ttft_ms=41.5, tpot_ms=11.25, predicted_n=17, predicted_ms=190.0)
    store.add_reply(session.id, "Leaves fall", model="smollm2", timings=timings, finish_reason="aborted",
                    stopped=True, route="local", route_reason="default")

    user, reply = store.turns(session.id)
    assert (user.role, user.content, user.seq) == ("user", "Write a haiku", 1)
    assert (reply.role, reply.content, reply.seq) == ("assistant", "Leaves fall", 2)
    assert reply.stopped and reply.finish_reason == "aborted"
    assert reply.model == "smollm2" and reply.route == "local" and reply.route_reason == "default"
    assert reply.timings == timings
    assert store.session(session.id).model == "smollm2"


def test_the_first_prompt_titles_the_session_and_a_rename_names_it(store: Store):
    session = store.create_session()
    assert store.session(session.id).label == "New chat"
    store.add_user_turn(session.id, "\n  How do I reverse a list in Python?\nThanks")
    store.add_user_turn(session.id, "another question")
    assert store.session(session.id).label == "How do I reverse a list in Python?"
    store.rename_session(session.id, "python lists")
    assert store.session(session.id).label == "python lists"
    assert store.find_session("python lists").id == session.id


def test_two_sessions_cannot_share_a_name(store: Store):
    store.create_session("work")
    other = store.create_session()
    with pytest.raises(NameTaken, match="'work' already exists"):
        store.rename_session(other.id, "work")


def test_sessions_are_listed_by_last_use(store: Store):
    first = store.create_session("first")
    store.create_session("second")
    store.add_user_turn(first.id, "hello again")
    assert [s.name for s in store.list_sessions()] == ["first", "second"]
    assert store.list_sessions()[0].turn_count == 1
    assert store.last_session().id == first.id


def test_open_named_session_creates_it_once(store: Store):
    created = store.open_named_session("notes")
    assert store.open_named_session("notes").id == created.id
    assert len(store.list_sessions()) == 1


def test_deleting_a_session_deletes_its_turns(store: Store):
    session = store.create_session()
    store.add_user_turn(session.id, "hi")
    store.delete_session(session.id)
    assert store.turns(session.id) == []
    with pytest.raises(SessionNotFound):
        store.session(session.id)


def test_clear_forgets_turns_and_summary_but_keeps_name_and_system_prompt(store: Store):
    session = store.create_session("kept", system="Be brief.")
    store.add_user_turn(session.id, "hi")
    store.set_summary(session.id, "they said hi")
    store.clear_turns(session.id)
    cleared = store.session(session.id)
    assert (cleared.name, cleared.system, cleared.summary, cleared.turn_count) == ("kept", "Be brief.", "", 0)


def test_recent_prompts_are_distinct_and_oldest_first(store: Store):
    session = store.create_session()
    for prompt in ["a", "b", "a", "c"]:
        store.add_user_turn(session.id, prompt)
    assert store.recent_prompts() == ["b", "a", "c"]


def test_settings_round_trip(store: Store):
    assert store.get_setting("theme") is None
    store.set_setting("theme", "nord")
    store.set_setting("theme", "gruvbox")
    assert store.get_setting("theme") == "gruvbox"


def test_a_committed_turn_survives_the_process_being_killed(tmp_path: Path):
    path = tmp_path / "s.db"
    script = (
        "import os, sys; from pathlib import Path; from localchat.store import Store\n"
        "s = Store.open(Path(sys.argv[1])); sid = s.create_session('k').id\n"
        "s.add_user_turn(sid, 'question'); s.add_reply(sid, 'answer', model='m')\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(path)], cwd=Path(__file__).parents[1])
    assert proc.returncode == -9
    with Store.open(path) as store:
        session = store.find_session("k")
        assert [t.content for t in store.turns(session.id)] == ["question", "answer"]


def test_two_connections_writing_one_session_at_once_keep_every_turn(tmp_path: Path):
    path = tmp_path / "s.db"
    with Store.open(path) as setup:
        session_id = setup.create_session("shared").id
    errors: list[BaseException] = []

    def writer(label: str) -> None:
        try:
            with Store.open(path) as store:
                for i in range(25):
                    store.add_user_turn(session_id, f"{label}{i}")
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(label,)) for label in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store.open(path) as store:
        turns = store.turns(session_id)
    assert len(turns) == 50
    assert [t.seq for t in turns] == list(range(1, 51))


def test_a_file_that_is_not_a_database_is_a_readable_error(tmp_path: Path):
    path = tmp_path / "sessions.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"could not be used: file is not a database"):
        Store.open(path)


def test_a_version_1_database_is_upgraded_keeping_its_sessions_and_becomes_searchable(tmp_path: Path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    schema.upgrade(db, schema.UPGRADES[:1])  # the schema localchat shipped before search
    db.execute("INSERT INTO sessions (name, system, created_at, updated_at) VALUES ('old', 'Be brief.', 1, 1)")
    db.execute("INSERT INTO turns (session_id, seq, role, content, created_at) "
               "VALUES (1, 1, 'user', 'Where do penguins live?', 1)")
    db.close()

    with Store.open(path) as store:
        assert store.schema_version == schema.latest_version()
        assert [t.content for t in store.turns(1)] == ["Where do penguins live?"]
        assert store.system_history(1) == [(0, "Be brief.")]  # it applied from the start
        assert [(h.session_id, h.seq) for h in store.search("penguins")] == [(1, 1)]
        store.add_reply(1, "In Antarctica, mostly.", model="m")
        assert [h.seq for h in store.search("antarctica")] == [2]


def test_a_version_5_database_gains_tool_turns_keeping_its_rows_ids_search_and_branches(tmp_path: Path):
    from localchat.reply.calls import ToolCall, ToolResult
    from localchat.store import branches

    path = tmp_path / "v5.db"
    db = sqlite3.connect(path, isolation_level=None)
    schema.upgrade(db, schema.UPGRADES[:5])  # before tool rounds
    db.execute("INSERT INTO sessions (name, created_at, updated_at) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO turns (id, session_id, seq, role, content, created_at) "
               "VALUES (7, 1, 1, 'user', 'Where do penguins live?', 1)")
    db.close()

    with Store.open(path) as store:
        assert store.schema_version == schema.latest_version()
        assert [(t.id, t.content) for t in store.turns(1)] == [(7, "Where do penguins live?")]
        assert [h.seq for h in store.search("penguins")] == [1]
        call = ToolCall("abc123XYZ", "lookup", {"animal": "penguin"}, raw="<tool_call>...</tool_call>")
        store.add_reply(1, "Let me check.<tool_call>...</tool_call>", model="m", tool_calls=(call,))
        store.add_tool_result(1, ToolResult("abc123XYZ", "lookup", "Antarctica", notice="n"),
                              label="zoo.lookup", elapsed_ms=12.5)
        store.add_reply(1, "In Antarctica.", model="m")
        turns = store.turns(1)
        assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
        assert turns[1].tool_calls == (call,) and turns[1].answer == "Let me check."
        assert (turns[2].tool_call_id, turns[2].tool_name, turns[2].tool_label,
                turns[2].elapsed_ms, turns[2].notice) == ("abc123XYZ", "lookup", "zoo.lookup", 12.5, "n")
        assert [h.seq for h in store.search("antarctica")] == [3, 4]
        branches.fork(store, 1, 2)  # a retry: the round goes aside as a branch and comes back
        assert [t.role for t in store.turns(1)] == ["user"]
        store.add_reply(1, "Another answer.", model="m")
        assert branches.switch(store, 1, 2, -1)
        assert store.turns(1)[1:] == [replace(t, id=store.turns(1)[i + 1].id) for i, t in enumerate(turns[1:])]


def test_search_finds_messages_of_every_session_and_reads_the_query_literally(store: Store):
    first, second = store.create_session(), store.create_session()
    store.add_user_turn(first.id, "How do I reverse a list in Python?")
    store.add_reply(first.id, "Use reversed(items) or items[::-1].", model="m")
    store.add_user_turn(second.id, "A haiku about lists, please")
    assert {h.session_id for h in store.search("lists")} == {second.id}
    assert {(h.session_id, h.role) for h in store.search("reversed")} == {(first.id, "assistant")}
    assert store.search('reverse" OR "x') == []  # quotes and operators are just text
    with pytest.raises(UserError, match="at least one word"):
        store.search("   ")
    store.delete_session(first.id)
    assert store.search("reversed") == []


def test_a_session_is_found_by_name_or_by_id_and_a_number_never_creates_one(store: Store):
    named = store.open_named_session("notes")
    unnamed = store.create_session()
    assert store.resolve_session("notes").id == named.id
    assert store.resolve_session(str(unnamed.id)).id == unnamed.id
    with pytest.raises(SessionNotFound, match="No session with id 99"):
        store.resolve_session("99", create=True)
    with pytest.raises(SessionNotFound, match="No session named 'other'"):
        store.resolve_session("other")
    assert store.resolve_session("other", create=True).name == "other"


def test_a_system_prompt_change_is_recorded_where_it_happened(store: Store):
    session = store.create_session()
    store.add_user_turn(session.id, "hi")
    store.add_reply(session.id, "hello", model="m")
    store.set_system(session.id, "Answer in French.")
    assert store.system_history(session.id) == [(2, "Answer in French.")]
    store.clear_turns(session.id)
    assert store.system_history(session.id) == [(0, "Answer in French.")]


def test_sessions_carry_a_preview_of_their_newest_message(store: Store):
    session = store.create_session()
    assert store.session(session.id).preview == ""
    store.add_user_turn(session.id, "first line\nsecond line")
    assert store.session(session.id).preview == "first line"
