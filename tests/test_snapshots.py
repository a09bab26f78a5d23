"""Reopening a session ready to answer: KV snapshots on disk, restored in a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from heavy_imports import heavy_modules_loaded_by

from localchat.engine.layout import CachedMessage
from localchat.engine.snapshot_file import KVSnapshot, SnapshotStore, SnapshotUnusable
from localchat.store import Store

FINGERPRINT = {"model_file": "m.gguf", "n_ctx": 2048, "kv_type": "f16"}


def snapshot(n_bytes=1000, tokens=(1, 2, 3)):
    records = [CachedMessage("user", "hi", "<user>hi", list(tokens))]
    return KVSnapshot(records, os.urandom(n_bytes))


def test_snapshot_round_trips_records_state_and_meta(tmp_path):
    store = SnapshotStore(tmp_path)
    original = snapshot()
    store.save("s1", FINGERPRINT, original, {"first_visible": 2})
    saved = store.load("s1", FINGERPRINT)
    assert saved.snapshot.state == original.state
    assert saved.snapshot.records == original.records
    assert saved.meta == {"first_visible": 2}


def test_snapshot_keeps_which_cells_are_exact(tmp_path):
    store = SnapshotStore(tmp_path)
    original = snapshot(tokens=range(10))
    original.exact_n = 4  # cells 4.. were moved by a trim shift
    store.save("s1", FINGERPRINT, original)
    assert store.load("s1", FINGERPRINT).snapshot.exact_n == 4


def test_snapshot_from_before_the_exactness_record_is_refused(tmp_path):
    store = SnapshotStore(tmp_path)
    path = store.save("s1", FINGERPRINT, snapshot())
    path.write_bytes(b"LCKVSNP1" + path.read_bytes()[8:])  # may hold cells rotated into place
    with pytest.raises(SnapshotUnusable, match="older localchat"):
        store.load("s1", FINGERPRINT)


def test_missing_snapshot_is_none(tmp_path):
    assert SnapshotStore(tmp_path).load("nope", FINGERPRINT) is None


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_damaged_snapshot_is_refused(tmp_path, damage):
    store = SnapshotStore(tmp_path)
    path = store.save("s1", FINGERPRINT, snapshot())
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data = bytearray(b"not a snapshot at all" * 4)
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotUnusable):
        store.load("s1", FINGERPRINT)


def test_snapshot_of_another_model_or_context_size_is_refused(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save("s1", FINGERPRINT, snapshot())
    with pytest.raises(SnapshotUnusable, match="another model or settings"):
        store.load("s1", {**FINGERPRINT, "n_ctx": 4096})


def test_least_recently_used_snapshots_are_evicted_beyond_the_cap(tmp_path):
    store = SnapshotStore(tmp_path, cap_bytes=2500)
    for key in ("a", "b", "c"):
        store.save(key, FINGERPRINT, snapshot(1000))
        os.utime(store.path_for(key), (1, {"a": 100, "b": 200, "c": 300}[key]))
    store.load("a", FINGERPRINT)  # a is used again: b is now the oldest
    store.save("d", FINGERPRINT, snapshot(1000))
    names = sorted(p.stem for p in store.files())
    assert "b" not in names and "d" in names and store.total_bytes() <= 2500


def test_prune_removes_snapshots_and_stray_temp_files(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save("a", FINGERPRINT, snapshot())
    (tmp_path / ".a.kvsnap.123.tmp").write_bytes(b"half written")
    count, freed = store.prune()
    assert count == 2 and freed > 0 and store.files() == []


def test_pruning_saved_contexts_loads_neither_llama_cpp_nor_numpy(isolated_home):
    from localchat import paths

    SnapshotStore(paths.snapshots_dir()).save("session-1", FINGERPRINT, snapshot())
    loaded, output = heavy_modules_loaded_by(["sessions", "--prune"], isolated_home)
    assert "removed 1 saved context" in output and not {"llama_cpp", "numpy"} & set(loaded)


# -- with the real model, across processes ---------------------------------------------------

def ask(model, home, *args):
    env = {**os.environ, "LOCALCHAT_HOME": str(home)}
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "ask", "--model", str(model), "--json",
         "--temperature", "0", "--max-tokens", "12", "--n-ctx", "2048", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return result.returncode, events


def done_of(events):
    return next(e for e in events if e["event"] == "done")


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def test_a_new_process_restores_the_session_instead_of_prefilling_it(test_model_path, home):
    for question in ["My name is Ada.", "I live in Lisbon and I like tea."]:
        code, _ = ask(test_model_path, home, "--session", "s", question)
        assert code == 0
    code, events = ask(test_model_path, home, "--session", "s", "Where do I live?")
    t = done_of(events)["timings"]
    assert code == 0
    assert t["restore_ms"] > 0 and t["cache_n"] > 40
    assert t["prompt_n"] < 25  # the new message (and an end marker), not the conversation
    with Store.open(home / "data" / "sessions.db") as store:
        (session,) = store.list_sessions()
        assert [turn.role for turn in store.turns(session.id)] == ["user", "assistant"] * 3


def test_damaged_snapshot_is_rebuilt_with_a_notice(test_model_path, home):
    assert ask(test_model_path, home, "--session", "s", "Hello there.")[0] == 0
    (snap,) = (home / "cache" / "kv").glob("*.kvsnap")
    snap.write_bytes(snap.read_bytes()[:-500])
    code, events = ask(test_model_path, home, "--session", "s", "Still there?")
    notices = [e for e in events if e["event"] == "notice"]
    t = done_of(events)["timings"]
    assert code == 0 and notices and "rebuilding" in notices[0]["message"]
    assert t["cache_n"] == 0 and t["prompt_n"] > 20 and t["restore_ms"] == 0


def test_snapshot_for_another_context_size_is_ignored(test_model_path, home):
    assert ask(test_model_path, home, "--session", "s", "Hello there.")[0] == 0
    code, events = ask(test_model_path, home, "--session", "s", "--n-ctx", "1024", "Still there?")
    assert code == 0
    assert any("another model or settings" in e.get("message", "") for e in events)
    assert done_of(events)["timings"]["cache_n"] == 0


def test_app_and_ask_writing_the_same_session_keep_the_store_consistent(test_model_path, home):
    db = home / "data" / "sessions.db"
    assert ask(test_model_path, home, "--session", "shared", "First.")[0] == 0
    errors = []

    def app_writes():  # the app committing turns to the same session meanwhile
        try:
            with Store.open(db) as store:
                session = store.find_session("shared")
                for i in range(20):
                    store.add_user_turn(session.id, f"from the app {i}")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writer = threading.Thread(target=app_writes)
    writer.start()
    code, _ = ask(test_model_path, home, "--session", "shared", "Second.")
    writer.join()
    assert code == 0 and not errors
    with Store.open(db) as store:
        turns = store.turns(store.find_session("shared").id)
    assert len(turns) == 2 + 20 + 2
    assert len({t.seq for t in turns}) == len(turns)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_app_saves_and_restores_a_session_only_while_snapshots_are_enabled(
        engine, greedy, isolated_home, enabled):
    from localchat import paths
    from localchat.chat.conversation import Conversation
    from localchat.chat.services import build_services

    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(f"[snapshots]\nenabled = {str(enabled).lower()}\n")
    services = build_services()
    with Store.open() as store:
        session = store.create_session("s")
        first = Conversation(store, session, services)
        first.attach(engine, greedy)
        first.record_reply(list(first.send("My name is Ada."))[-1], engine.name)
        services.close()  # the snapshot's file is written
        engine.reset()  # as if the app had been closed and opened again
        reopened = Conversation(store, store.session(session.id), services)
        reopened.attach(engine, greedy)
        done = list(reopened.send("What is my name?"))[-1]
    saved = list(paths.snapshots_dir().glob("*.kvsnap"))
    if enabled:
        assert len(saved) == 1 and done.timings.restore_ms > 0
    else:
        assert services.snapshots is None
        assert saved == [] and done.timings.restore_ms == 0 and done.timings.cache_n == 0


def test_a_conversation_over_the_fake_engine_is_kept_and_restored_like_one_over_the_real():
    """No branch asks which engine a conversation has: over the UI tests' fake, too, the context
    keeper measures each turn and a reopened session's cache comes back from its snapshot."""
    from fake_engine import FakeEngine

    from localchat.chat.conversation import Conversation
    from localchat.chat.services import build_services

    services = build_services()
    engine = FakeEngine()
    engine.load()
    with Store.open() as store:
        session = store.create_session("s")
        first = Conversation(store, session, services)
        first.attach(engine)
        assert first.chat is not None and first.chat.keeper is not None
        first.record_reply(list(first.send("My name is Ada."))[-1], engine.name)
        services.close()  # the snapshot's file is written
        cached = engine.tokens_in_context
        engine.reset()  # as if the app had been closed and opened again
        reopened = Conversation(store, store.session(session.id), services)
        reopened.attach(engine)
        done = list(reopened.send("What is my name?"))[-1]
    assert cached > 0 and done.timings.cache_n == cached
