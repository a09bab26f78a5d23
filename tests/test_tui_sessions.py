"""Sessions: the sidebar, switching, persistence across app restarts, and `localchat sessions`."""

from __future__ import annotations

import json

from fake_engine import SIZE, FakeEngine, make_app, notices, ready, reply_finished, send, wait_until

from localchat.bench.scripted_engine import store_conversation
from localchat.cli import main
from localchat.tui.chat_log import HISTORY_PAGE, EarlierMessages, ReplyView, UserMessage, page_start
from localchat.tui.screens import AskTextScreen, ConfirmScreen
from localchat.tui.sidebar import SessionList


def shown_prompts(app) -> list[str]:
    return [str(m.body.content) for m in app.chat_log.query(UserMessage)]


def sidebar_labels(app) -> list[str]:
    options = app.query_one(SessionList)
    return [str(options.get_option_at_index(i).prompt).lstrip("● ").strip().split("\n")[0]
            for i in range(options.option_count)]


def sidebar_details(app) -> list[str]:
    """Each session's second line: when it was last used and its newest message."""
    options = app.query_one(SessionList)
    return [str(options.get_option_at_index(i).prompt).split("\n")[1].strip() for i in range(options.option_count)]


async def test_a_conversation_survives_an_app_restart_with_continue(store):
    first = make_app(store, FakeEngine(reply="Nice to meet you."))
    async with first.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "My name is Ada.")
        await reply_finished(pilot)

    engine = FakeEngine(reply="Ada.")
    again = make_app(store, engine, continue_last=True)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert shown_prompts(again) == ["My name is Ada."]
        assert again.chat_log.last_reply().text == "Nice to meet you."
        await send(pilot, "What is my name?")
        await reply_finished(pilot)
    assert [m["content"] for m in engine.submitted[0]] == ["My name is Ada.", "Nice to meet you.", "What is my name?"]


async def test_session_name_opens_that_session_or_creates_it(store):
    notes = store.create_session("notes")
    store.add_user_turn(notes.id, "kept in notes")
    store.create_session("newer")
    app = make_app(store, FakeEngine(), session="notes")
    async with app.run_test(size=SIZE):
        assert app.conversation.session_id == notes.id
        assert shown_prompts(app) == ["kept in notes"]
        assert app.prompt.border_title == "notes"
    fresh = make_app(store, FakeEngine(), session="brand new")
    async with fresh.run_test(size=SIZE):
        assert fresh.conversation.record.name == "brand new"


async def test_the_sidebar_lists_sessions_by_last_use_and_switches_between_them(store):
    older = store.create_session("older")
    store.add_user_turn(older.id, "old question")
    store.add_reply(older.id, "old answer", model="fake-model")
    app = make_app(store, FakeEngine(reply="ok"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "new question")
        await reply_finished(pilot)
        await pilot.press("ctrl+b")
        assert app.sidebar.display
        assert sidebar_labels(app) == ["new question", "older"]
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: shown_prompts(app) == ["old question"], "the older session")
        assert app.chat_log.last_reply().text == "old answer"
        assert app.focused is app.prompt
        assert sidebar_labels(app)[0] == "older"  # just used


async def test_sessions_are_renamed_and_deleted_from_the_sidebar_after_confirmation(store):
    other = store.create_session("other")
    store.add_user_turn(other.id, "something")
    app = make_app(store, FakeEngine(reply="ok"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "current")
        await reply_finished(pilot)
        await pilot.press("ctrl+b", "down", "r")
        await wait_until(pilot, lambda: isinstance(app.screen, AskTextScreen), "the rename question")
        await pilot.press(*"renamed", "enter")  # the old name starts selected: typing replaces it
        await wait_until(pilot, lambda: "renamed" in sidebar_labels(app), "the new name")

        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the delete question")
        await pilot.press("n")
        await pilot.pause()
        assert store.find_session("renamed") is not None
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the delete question")
        await pilot.press("y")
        await wait_until(pilot, lambda: store.find_session("renamed") is None, "the deletion")
        assert sidebar_labels(app) == ["current"]


async def test_deleting_the_open_session_opens_another(store):
    keep = store.create_session("keep")
    store.add_user_turn(keep.id, "keep me")
    app = make_app(store, FakeEngine(reply="ok"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "delete me")
        await reply_finished(pilot)
        doomed = app.conversation.session_id
        await pilot.press("ctrl+b", "d", "y")
        await wait_until(pilot, lambda: app.conversation.session_id == keep.id, "the remaining session")
        assert shown_prompts(app) == ["keep me"]
    assert [s.id for s in store.list_sessions()] == [keep.id] and doomed != keep.id


async def test_switching_sessions_while_a_reply_streams_stops_and_saves_it(store):
    other = store.create_session("other")
    app = make_app(store, FakeEngine(reply="one two three four", hold_after=2))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "start")
        streaming = app.conversation.session_id
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "one two", "two tokens")
        await pilot.press("ctrl+b", "down", "enter")
        await wait_until(pilot, lambda: app.conversation.session_id == other.id, "the switch")
        await wait_until(pilot, lambda: app.turns.current is None, "the stopped reply to be saved")
        assert not app.chat_log.query(ReplyView)
    saved = store.turns(streaming)[-1]
    assert (saved.content, saved.stopped) == ("one two", True)


async def test_a_session_left_without_messages_is_not_kept_not_even_the_one_open_at_quit(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+n")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert len(store.list_sessions()) == 1  # the one on screen
    assert store.list_sessions() == []  # a restart does not list an empty "New chat"


async def test_the_sidebar_shows_each_session_with_its_date_and_newest_message(store):
    old = store.create_session()
    store.add_user_turn(old.id, "How do penguins keep warm?")
    store.add_reply(old.id, "Feathers and huddles.", model="m")
    store.create_session()  # empty, left by a crash: not listed
    app = make_app(store, FakeEngine())
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert sidebar_labels(app) == ["New chat", "How do penguins keep warm?"]  # not the empty one
        assert sidebar_details(app)[1].startswith("today ") and sidebar_details(app)[1].endswith(
            " · Feathers and huddles.")


def test_sessions_command_lists_sessions_by_last_use(store, capsys):
    work = store.create_session("work")
    store.add_user_turn(work.id, "hello")
    store.add_reply(work.id, "hi", model="smollm2-135m")
    untitled = store.create_session()
    store.add_user_turn(untitled.id, "How do tides work?")

    assert main(["sessions"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "SESSION", "TURNS", "MODEL", "LAST", "USED"]
    assert "How do tides work?" in table[1] and "work" in table[2] and "smollm2-135m" in table[2]

    assert main(["sessions", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["label"], r["turns"]) for r in rows] == [("How do tides work?", 1), ("work", 2)]


def test_sessions_command_with_no_sessions_says_how_to_start(capsys):
    assert main(["sessions"]) == 0
    assert "No sessions yet" in capsys.readouterr().out


async def test_the_first_prompt_titles_the_session_while_the_reply_streams(store):
    app = make_app(store, FakeEngine(reply="a b c", hold_after=1))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+b")
        assert sidebar_labels(app) == ["New chat"]
        await pilot.press("escape")  # from the sidebar back to the prompt
        assert app.focused is app.prompt
        await send(pilot, "Plan a trip to Lisbon")
        await wait_until(pilot, lambda: sidebar_labels(app) == ["Plan a trip to Lisbon"], "the title")
        assert app.prompt.border_title == "Plan a trip to Lisbon"
        await pilot.press("escape")
        await reply_finished(pilot)


async def test_search_finds_a_message_in_another_session_and_opens_it(store):
    from localchat.tui.screens import SearchScreen

    old = store.create_session("trip")
    store.add_user_turn(old.id, "Pack sunscreen and a penguin plush.")
    store.add_reply(old.id, "Noted.", model="m")
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "/search penguin")
        await wait_until(pilot, lambda: isinstance(app.screen, SearchScreen), "the results")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.conversation.session_id == old.id, "the found session")
        await send(pilot, "/search zebra")
        await wait_until(pilot, lambda: any("No message contains" in n for n in notices(app)), "no match")


async def test_a_long_session_opens_on_its_last_page_and_scrolling_up_mounts_the_rest_in_place(store):
    # Mounting every stored message made a 200-turn session take over 8 s to open.
    store_conversation(store, 25, "fake-model")
    stored = [t.content for t in store.turns(store.last_session().id)]
    app = make_app(store, continue_last=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        log = app.chat_log
        assert [m.text for m in log.messages()] == stored[-HISTORY_PAGE:]
        assert str(log.query_one(EarlierMessages).content) == "▲ 30 earlier messages: scroll up to show them"
        for shown in (2 * HISTORY_PAGE, len(stored)):
            first = log.messages()[0]
            row = log.content_region.y + first.virtual_region.y  # where the top shows it
            log.scroll_home(animate=False)
            await wait_until(pilot, lambda: len(log.messages()) == shown, "the page above")  # noqa: B023
            await pilot.pause()
            # The page went above it and the view stayed where it was (on a loaded machine the
            # layout that puts it back can come a refresh or two after the mount: CI seed 247634178).
            await wait_until(pilot, lambda: first.region.y == row,  # noqa: B023
                             f"the first message back at row {row}")
            assert log.scroll_y > 0
        assert [m.text for m in log.messages()] == stored and not log.query(EarlierMessages)


async def test_selecting_above_the_first_message_shown_mounts_the_page_above(store):
    store_conversation(store, 15, "fake-model")
    app = make_app(store, continue_last=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        log = app.chat_log
        first = log.messages()[0]
        log.focus()
        log.select(first)
        await pilot.press("up")
        await wait_until(pilot, lambda: len(log.messages()) == 30, "the page above")
        assert log.selected is log.messages()[9] and log.messages()[10] is first


def test_a_page_of_stored_messages_starts_at_a_prompt():
    class Turn:
        def __init__(self, role: str) -> None:
            self.role = role

    turns = [Turn(r) for r in ["user", "assistant", "user", "assistant", "assistant", "user", "assistant"]]
    assert page_start(turns, size=2) == 5
    assert page_start(turns, size=3) == 2  # a reply without its prompt is not a page's first
    assert page_start(turns[:2], size=5) == 0
