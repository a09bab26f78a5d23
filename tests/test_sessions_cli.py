"""``localchat sessions``: search over all messages, export by id or name, and ``ask --session``
reaching a session by its id (run in-process through ``cli.main``)."""

from __future__ import annotations

import json

import pytest

from localchat.cli import main
from localchat.store import Store


@pytest.fixture
def sessions():
    with Store.open() as store:
        first = store.create_session()  # unnamed: reachable by id only
        store.add_user_turn(first.id, "How do penguins keep warm?")
        store.add_reply(first.id, "Feathers and huddles.", model="m")
        store.set_system(first.id, "Be brief.")
        store.add_user_turn(first.id, "And their chicks?")
        named = store.create_session("notes")
        store.add_user_turn(named.id, "groceries: milk, eggs")
        return first.id, named.id


def test_search_lists_matching_messages_with_their_session_ids(sessions, capsys):
    first, named = sessions
    assert main(["sessions", "--search", "penguins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].split()[0] == str(first) and "penguins" in out[0]

    assert main(["sessions", "--search", "milk", "--json"]) == 0
    hit = json.loads(capsys.readouterr().out)
    assert (hit["session"], hit["label"], hit["role"]) == (named, "notes", "user")


def test_search_with_no_match_says_so_and_exits_1(sessions, capsys):
    assert main(["sessions", "--search", "zebra"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "No message contains 'zebra'" in captured.err


def test_export_by_id_shows_a_system_prompt_where_it_was_set(sessions, capsys):
    first, _ = sessions
    assert main(["sessions", "--export", str(first)]) == 0
    text = capsys.readouterr().out
    assert text.index("Feathers and huddles.") < text.index("System prompt changed to:") < text.index("chicks")

    assert main(["sessions", "--export", str(first), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [m["role"] for m in document["messages"]] == ["user", "assistant", "user"]
    assert document["system_changes"] == [{"after_seq": 2, "system": "Be brief."}]


def test_an_unknown_session_is_one_line_and_exit_1(sessions, capsys):
    assert main(["sessions", "--export", "99"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localchat: error: No session with id 99") and err.count("\n") == 1


def test_the_sessions_json_carries_a_preview(sessions, capsys):
    assert main(["sessions", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["preview"] for r in rows} == {"And their chicks?", "groceries: milk, eggs"}
