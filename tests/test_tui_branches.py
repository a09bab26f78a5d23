"""Edit and rewind (#14): an edited prompt forks the conversation there, the old branch stays
reachable with ←/→, /retry keeps the previous reply as a sibling; and actions on any message:
select it with the keyboard, copy it or one of its code blocks, write the input in $EDITOR."""

from __future__ import annotations

import stat

import pytest
from fake_engine import SIZE, FakeEngine, make_app, notices, ready, reply_finished, send, wait_until

from localchat.store import Store, branches
from localchat.tui.chat_log import UserMessage

pytestmark = pytest.mark.usefixtures("no_clipboard_tools")


def echo(messages):
    return "re: " + messages[-1]["content"]


def contents(store) -> list[str]:
    return [t.content for t in store.turns(store.last_session().id)]


def test_a_fork_keeps_the_old_turns_and_switching_swaps_them_back(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        session = store.create_session()
        for text in ("one", "two"):
            store.add_user_turn(session.id, text)
            store.add_reply(session.id, "re: " + text, model="m")
        branches.fork(store, session.id, 3)
        store.add_user_turn(session.id, "TWO")
        store.add_reply(session.id, "re: TWO", model="m")
        assert branches.branches_at(store, session.id, 3) == branches.Branches(3, 2, 1)
        assert branches.switch(store, session.id, 3, -1)
        assert [t.content for t in store.turns(session.id)] == ["one", "re: one", "two", "re: two"]
        assert not branches.switch(store, session.id, 3, -1)  # already the oldest
        assert branches.switch(store, session.id, 3, +1)
        assert [t.content for t in store.turns(session.id)][2:] == ["TWO", "re: TWO"]


async def test_editing_an_earlier_prompt_forks_there_and_left_right_show_both_branches(store):
    engine = FakeEngine(reply=echo)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
            await reply_finished(pilot)
        await pilot.press("alt+up")  # the newest message is selected
        await pilot.press("up", "up", "up")  # reply two, prompt two... up to prompt "two"
        assert app.chat_log.selected.text == "two"
        await pilot.press("e")
        assert app.prompt.text == "two" and app.message_actions.editing is not None
        app.prompt.text = "TWO"
        await pilot.press("enter")
        await reply_finished(pilot)
        assert contents(store) == ["one", "re: one", "TWO", "re: TWO"]
        # The model saw the conversation cut at the fork, then the edited prompt.
        assert [m["content"] for m in engine.submitted[-1]] == ["one", "re: one", "TWO"]
        assert app.chat_log.query(UserMessage).last().versions_label == "‹ 2/2 ›"

        await pilot.press("alt+up", "up")
        await pilot.press("left")
        await wait_until(pilot, lambda: contents(store)[2:] == ["two", "re: two", "three", "re: three"],
                         "the old branch")
        assert app.chat_log.query(UserMessage).nodes[1].versions_label == "‹ 1/2 ›"
        assert [m.text for m in app.chat_log.query(UserMessage)] == ["one", "two", "three"]
        await pilot.press("escape")  # back to the input
        await send(pilot, "four")  # the conversation goes on from the branch on screen
        await reply_finished(pilot)
    assert [m["content"] for m in engine.submitted[-1]][-3:] == ["three", "re: three", "four"]


async def test_retry_keeps_the_previous_reply_as_a_sibling(store):
    replies = iter(["first answer", "second answer"])
    app = make_app(store, FakeEngine(reply=lambda m: next(replies)))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "question")
        await reply_finished(pilot)
        await send(pilot, "/retry")
        await reply_finished(pilot)
        assert contents(store) == ["question", "second answer"]
        assert app.chat_log.query(UserMessage).last().versions_label == "‹ 2/2 ›"
        await pilot.press("alt+up", "up", "left")
        await wait_until(pilot, lambda: contents(store) == ["question", "first answer"], "the first answer")
        assert app.chat_log.last_reply().text == "first answer"


async def test_any_message_or_code_block_can_be_copied_from_the_keyboard(store):
    app = make_app(store, FakeEngine(reply="A:\n\n```sh\nls\n```\n\nB:\n\n```sh\npwd\n```\n"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "commands?")
        await reply_finished(pilot)
        await send(pilot, "again")
        await reply_finished(pilot)
        await pilot.press("alt+up", "up", "up")  # the first reply
        await pilot.press("2")
        assert app.clipboard == "pwd"
        await pilot.press("up", "c")
        assert app.clipboard == "commands?"
        await pilot.press("3")
        await wait_until(pilot, lambda: any("code block" in n for n in notices(app)), "the refusal")
        await pilot.press("escape")
        assert app.focused is app.prompt


async def test_ctrl_e_writes_the_input_in_the_editor(store, tmp_path, monkeypatch):
    editor = tmp_path / "editor.sh"
    editor.write_text('#!/bin/sh\nprintf "written in the editor\\n" >> "$1"\n')
    editor.chmod(editor.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("VISUAL", str(editor))
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.prompt.text = "draft: "
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: app.prompt.text == "draft: written in the editor", "the edited text")
