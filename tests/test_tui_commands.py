"""Slash commands in the running app, their autocomplete, and the command palette."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engine import (
    SIZE,
    FakeEngine,
    command,
    make_app,
    notices,
    ready,
    reply_finished,
    send,
    wait_until,
)
from textual.widgets import Markdown

from localchat.tui import clipboard
from localchat.tui.prompt import CommandHints
from localchat.tui.screens import ConfirmScreen, HelpScreen, PageScreen

pytestmark = pytest.mark.usefixtures("no_clipboard_tools")


async def test_system_sets_the_prompt_the_model_sees_and_is_saved(store):
    engine = FakeEngine(reply="ok")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/system Answer in French.")
        await send(pilot, "hello")
        await reply_finished(pilot)
    assert engine.submitted[0][0] == {"role": "system", "content": "Answer in French."}
    assert store.last_session().system == "Answer in French."


async def test_system_mid_session_starts_the_reprefill_in_the_background(store):
    engine = FakeEngine(reply="ok")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await reply_finished(pilot)
        assert engine.prepared == []
        await command(pilot, "/system Answer in French.")
    # At once, not when the next message waits for it: the whole conversation under the new prompt.
    assert engine.prepared == [[{"role": "system", "content": "Answer in French."},
                                {"role": "user", "content": "hello"},
                                {"role": "assistant", "content": "ok"}]]


async def test_new_starts_an_empty_session_and_rename_names_it(store):
    app = make_app(store, FakeEngine(reply="ok"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "in the first session")
        await reply_finished(pilot)
        first = app.conversation.session_id
        await command(pilot, "/new")
        assert app.conversation.session_id != first
        assert app.chat_log.last_reply() is None
        await command(pilot, "/rename scratch pad")
        assert app.prompt.border_title == "scratch pad"
    assert store.find_session("scratch pad").id != first


async def test_clear_asks_first_then_forgets_the_messages(store):
    engine = FakeEngine(reply="ok")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        await reply_finished(pilot)
        await command(pilot, "/clear")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.chat_log.last_reply() is None, "the log to empty")
        assert store.turns(app.conversation.session_id) == []
        await send(pilot, "fresh start")
        await reply_finished(pilot)
    assert [m["content"] for m in engine.submitted[-1]] == ["fresh start"]


async def test_retry_asks_the_last_question_again_in_place_of_the_old_answer(store):
    replies = iter(["first answer", "second answer"])
    app = make_app(store, FakeEngine(reply=lambda messages: next(replies)))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "question")
        await reply_finished(pilot)
        await command(pilot, "/retry")
        await reply_finished(pilot)
        assert app.chat_log.last_reply().text == "second answer"
        assert len(app.chat_log.query("UserMessage")) == 1
    assert [t.content for t in store.turns(store.last_session().id)] == ["question", "second answer"]


async def test_copy_sends_the_reply_over_osc52_and_saves_a_fallback_file(store):
    app = make_app(store, FakeEngine(reply="Run:\n\n```sh\nls -la\n```\n"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "list files")
        await reply_finished(pilot)
        await command(pilot, "/copy code")
        assert app.clipboard == "ls -la"
        await wait_until(pilot, lambda: any("Saved 6 characters to" in n for n in notices(app)), "the copy notice")
        assert clipboard.clipboard_file().read_text() == "ls -la"
        await command(pilot, "/copy")
        assert app.clipboard == "Run:\n\n```sh\nls -la\n```\n"


async def test_export_writes_the_session_as_markdown(store, tmp_path: Path):
    app = make_app(store, FakeEngine(reply="Paris."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Capital of France?")
        await reply_finished(pilot)
        target = tmp_path / "chat.md"
        await command(pilot, f"/export {target}")
        await wait_until(pilot, target.exists, "the export file")
    text = target.read_text()
    assert "## You\n\nCapital of France?" in text and "## fake-model\n\nParis." in text


async def test_summary_and_help_open_pages(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/summary")
        await wait_until(pilot, lambda: isinstance(app.screen, PageScreen), "the summary page")
        assert "No summary yet" in app.screen.query_one(Markdown).source
        await pilot.press("escape")
        await command(pilot, "/help")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help page")


async def test_model_switches_in_the_background_and_closes_the_old_one(store):
    engines = {"fake-model": FakeEngine("fake-model"), "other-model": FakeEngine("other-model", reply="hi")}
    app = make_app(store, engine_factory=lambda ref: engines[ref or "fake-model"])
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/model other-model")
        await wait_until(pilot, lambda: app.models.engine is engines["other-model"], "the new model")
        assert engines["fake-model"].closed
        assert app.status.info.model == "other-model"
        await send(pilot, "who are you?")
        await reply_finished(pilot)
    assert store.turns(store.last_session().id)[-1].model == "other-model"


async def test_unknown_commands_and_bad_arguments_are_notices(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/frobnicate")
        await command(pilot, "/copy everything")
        await command(pilot, "/retry")
        assert any("Unknown command /frobnicate" in n for n in notices(app))
        assert any("Usage: /copy [code]" in n for n in notices(app))
        assert any("no earlier message" in n for n in notices(app))
        assert app.is_running


async def test_double_slash_sends_a_message_starting_with_a_slash(store):
    engine = FakeEngine(reply="ok")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "//etc/hosts: what is it?")
        await reply_finished(pilot)
    assert engine.submitted[0][-1]["content"] == "/etc/hosts: what is it?"


async def test_typing_a_slash_shows_matching_commands_and_tab_completes(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        hints = app.query_one(CommandHints)
        await pilot.press("/", "r", "e")
        assert hints.display and "/retry" in str(hints.content) and "/rename NAME" in str(hints.content)
        await pilot.press("n", "tab")
        assert app.prompt.text == "/rename "
        app.prompt.text = "/model oth"
        await pilot.press("tab")
        assert app.prompt.text == "/model other-model"
        app.prompt.text = "plain text"
        await pilot.pause()
        assert not hints.display


async def test_the_command_palette_offers_the_slash_commands(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for name in ("/new", "/model", "/clear", "/retry", "/copy", "/sessions", "/export", "/summary", "/help"):
            assert name in titles
        assert "Theme" in " ".join(titles)
        new = next(c for c in app.get_system_commands(app.screen) if c.title == "/new")
        first = app.conversation.session_id
        new.callback()
        await wait_until(pilot, lambda: app.conversation.session_id != first, "a new session")
