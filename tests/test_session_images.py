"""Sessions keep the pictures their messages used: one content-addressed copy under the home,
named by the turn, restored with it (after the original moved), kept across branches, removed
when no session uses it, in exports, and committed before the turn that names it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from image_fixture import gif, png

from localchat.chat.conversation import Conversation
from localchat.engine.image_input import BadImage
from localchat.engine.image_records import digest
from localchat.store import Store, branches, export
from localchat.store import images as stored_images
from localchat.store.images import image_file, read_image

RED, BLUE = png(40, 30, (255, 0, 0)), png(8, 8, (0, 0, 255))


@pytest.fixture
def no_grace(monkeypatch):
    monkeypatch.setattr(stored_images, "GRACE_S", 0.0)


def pictures_folder(store: Store) -> Path:
    return stored_images.images_dir(store.path)


def test_a_user_turn_stores_its_pictures_by_content_and_reads_them_back(store):
    session = store.create_session()
    red = image_file("cat.png", RED)
    store.add_user_turn(session.id, "what is this?", [red, image_file("copy.png", RED)])
    (turn,) = store.turns(session.id)
    assert [ref.label for ref in turn.images] == ["cat.png 40x30", "copy.png 40x30"]
    assert turn.images[0].sha256 == digest(RED)
    assert [p.name for p in pictures_folder(store).iterdir()] == [f"{digest(RED)}.png"]
    assert store.image_bytes(turn.images[1]) == RED


def test_reopening_a_session_gives_the_model_the_same_bytes_after_the_file_moved(store, tmp_path):
    original = tmp_path / "cat.png"
    original.write_bytes(RED)
    engine = FakeEngine()
    engine.load()
    conversation = Conversation(store, store.create_session())
    conversation.attach(engine)
    handle = conversation.send("describe", images=[read_image(original)])
    final = list(handle)[-1]
    conversation.record_reply(final, engine.name)
    original.rename(tmp_path / "moved.png")

    reopened = Conversation(store, store.session(conversation.session_id))
    reopened.attach(engine)
    assert reopened.chat.history == conversation.chat.history
    assert reopened.chat.history[0].images == (RED,)
    assert reopened.chat.model_messages()[0]["images"] == [RED]


def test_a_picture_whose_copy_is_gone_is_left_out_with_a_notice(store):
    session = store.create_session()
    store.add_user_turn(session.id, "look", [image_file("cat.png", RED)])
    (pictures_folder(store) / f"{digest(RED)}.png").unlink()
    conversation = Conversation(store, store.session(session.id))
    engine = FakeEngine()
    engine.load()
    conversation.attach(engine)
    assert conversation.chat.history[0].images == ()
    assert any("cat.png" in n.message for n in conversation.take_notices())


def test_pictures_no_session_uses_are_removed_when_sessions_are_deleted(store, no_grace):
    keep, drop = store.create_session(), store.create_session()
    store.add_user_turn(keep.id, "a", [image_file("red.png", RED)])
    store.add_user_turn(drop.id, "b", [image_file("red.png", RED), image_file("blue.png", BLUE)])
    store.delete_session(drop.id)
    assert sorted(p.name for p in pictures_folder(store).iterdir()) == [f"{digest(RED)}.png"]
    store.clear_turns(keep.id)
    assert list(pictures_folder(store).iterdir()) == []


def test_a_picture_in_a_branch_set_aside_is_kept_and_comes_back(store, no_grace):
    session = store.create_session()
    store.add_user_turn(session.id, "first", [image_file("red.png", RED)])
    store.add_reply(session.id, "red", model="m")
    branches.fork(store, session.id, 1)
    store.add_user_turn(session.id, "another", [image_file("blue.png", BLUE)])
    store.delete_session(store.create_session().id)  # a sweep
    assert (pictures_folder(store) / f"{digest(RED)}.png").is_file()
    assert branches.switch(store, session.id, 1, -1)
    assert store.turns(session.id)[0].images[0].name == "red.png"


def test_a_picture_just_stored_outlives_a_sweep_for_a_turn_on_its_way(store):
    stored_images.save(store.path, image_file("red.png", RED))
    store.delete_session(store.create_session().id)
    assert (pictures_folder(store) / f"{digest(RED)}.png").is_file()
    assert store.remove_unused_images(grace_s=0) == 1


def test_exports_name_each_picture_with_its_sha_and_stored_copy(store):
    session = store.create_session()
    store.add_user_turn(session.id, "what colour?", [image_file("cat.png", RED)])
    store.add_reply(session.id, "Red.", model="m")
    markdown = export.to_markdown(store, session.id)
    assert f"[image: cat.png 40x30] `sha256:{digest(RED)}`" in markdown
    (message, _) = json.loads(export.to_json(store, session.id))["messages"]
    (picture,) = message["images"]
    assert picture["sha256"] == digest(RED) and picture["name"] == "cat.png"
    assert Path(picture["path"]).read_bytes() == RED
    assert (picture["format"], picture["width"], picture["height"]) == ("PNG", 40, 30)


def test_sessions_export_cli_includes_the_pictures(store, capsys):
    from localchat.cli import main

    session = store.create_session("pics")
    store.add_user_turn(session.id, "hi", [image_file("anim.gif", gif(4, 4))])
    assert main(["sessions", "--export", "pics"]) == 0
    assert "[image: anim.gif 4x4]" in capsys.readouterr().out


@pytest.mark.parametrize("data, why", [(b"hello, not a picture", "is not an image"),
                                       (RED[:-20], "damaged or truncated PNG")])
def test_a_bad_picture_is_refused_in_one_line(tmp_path, data, why):
    path = tmp_path / "bad.png"
    path.write_bytes(data)
    with pytest.raises(BadImage) as refused:
        read_image(path)
    assert why in str(refused.value) and "\n" not in str(refused.value)


def test_a_committed_turn_with_a_picture_survives_the_process_being_killed(tmp_path):
    path = tmp_path / "s.db"
    script = (
        "import os, sys; from pathlib import Path; from localchat.store import Store\n"
        "from localchat.store.images import image_file\n"
        "s = Store.open(Path(sys.argv[1])); sid = s.create_session('k').id\n"
        "s.add_user_turn(sid, 'question', [image_file('red.png', Path(sys.argv[2]).read_bytes())])\n"
        "os.kill(os.getpid(), 9)\n"
    )
    (tmp_path / "red.png").write_bytes(RED)
    proc = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "red.png")],
                          cwd=Path(__file__).parents[1])
    assert proc.returncode == -9
    with Store.open(path) as store:
        (turn,) = store.turns(store.find_session("k").id)
        assert store.image_bytes(turn.images[0]) == RED
