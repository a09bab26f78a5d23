"""Friction of the app people keep open all day (#14): switching models safely, a status bar
and toasts that follow what is on screen, the system prompt, input history, the palette, model
completion, scrolling while typing and copying inside tmux."""

from __future__ import annotations

import os
import stat
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

from localchat.errors import ModelNotFound
from localchat.events import Timings
from localchat.tui import clipboard
from localchat.tui.screens import PageScreen

pytestmark = pytest.mark.usefixtures("no_clipboard_tools")


async def test_switching_to_a_model_that_is_not_downloaded_keeps_the_current_one(store):
    working = FakeEngine("fake-model")

    def factory(ref):
        if ref == "missing":
            raise ModelNotFound("missing is not downloaded; run `localchat pull missing`")
        return working

    app = make_app(store, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/model missing")
        await wait_until(pilot, lambda: any("Keeping fake-model" in n for n in notices(app)), "the notice")
        assert app.models.engine is working and not working.closed
        assert app.status.info.model == "fake-model" and app.status.info.state == "idle"
        await send(pilot, "still there?")
        await reply_finished(pilot)
    assert store.turns(store.last_session().id)[-1].model == "fake-model"


async def test_a_model_that_fails_to_load_brings_the_previous_one_back(store):
    engines = {None: FakeEngine("fake-model"), "broken": FakeEngine("broken", load_error="out of memory")}
    app = make_app(store, engine_factory=lambda ref: engines[ref])
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/model broken")
        await wait_until(pilot, lambda: any("out of memory" in n for n in notices(app)), "the failure")
        await wait_until(pilot, lambda: app.models.engine is engines[None], "the previous model back")
        assert app.status.info.model == "fake-model" and app.status.info.state == "idle"


def test_a_gguf_whose_template_does_not_compile_is_refused_before_anything_is_unloaded(test_model_path, tmp_path):
    from localchat.engine.engine import Engine
    from localchat.errors import UserError

    data = bytearray(test_model_path.read_bytes())
    start = data.find(b"{% for message in messages %}")
    data[start:start + 2] = b"{{"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(bytes(data))
    engine = Engine(broken, name="broken")
    try:
        with pytest.raises(UserError, match="template"):
            engine.preflight()
        Engine(test_model_path, name="fine").preflight()
    finally:
        engine.close()


async def test_a_model_error_toast_goes_when_a_model_loads(store):
    engines = {"fake-model": FakeEngine("fake-model")}

    def factory(ref):
        if ref is None:
            raise ModelNotFound("no default model yet")
        return engines[ref]

    app = make_app(store, engine_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: any("no default model" in n for n in notices(app)), "the error")
        await command(pilot, "/model fake-model")
        await ready(pilot)
        await wait_until(pilot, lambda: not any("no default model" in n for n in notices(app)), "the toast to go")


async def test_the_status_bar_follows_the_session_on_screen_and_a_clear(store):
    old = store.create_session("old")
    store.add_user_turn(old.id, "hi")
    store.add_reply(old.id, "hello", model="m", timings=Timings(ttft_ms=50.0, predicted_n=3, n_ctx_used=792,
                                                               n_ctx=8192))
    app = make_app(store, FakeEngine(n_ctx=4096), session="old")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        info = app.status.info
        assert (info.n_ctx_used, info.n_ctx, info.ttft_ms) == (792, 4096, 50.0)
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.conversation.session_id != old.id, "the new session")
        assert (info.n_ctx_used, info.ttft_ms) == (0, None)
        await command(pilot, "/model fake-model")  # any state: now back to the old one and clear it
        await ready(pilot)
        await app.sessions.open(store.session(old.id))
        assert info.n_ctx_used == 792
        await command(pilot, "/clear")
        await pilot.press("y")
        await wait_until(pilot, lambda: info.n_ctx_used == 0, "the cleared context")


async def test_system_without_text_shows_the_prompt_and_clear_removes_it(store):
    engine = FakeEngine(reply="ok")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/system Answer in French.")
        await command(pilot, "/system")
        await wait_until(pilot, lambda: isinstance(app.screen, PageScreen), "the prompt shown")
        assert "Answer in French." in app.screen.query_one("Markdown").source
        await pilot.press("escape")
        assert store.last_session().system == "Answer in French."  # showing it did not clear it
        await command(pilot, "/system clear")
        assert store.last_session().system == ""


async def test_an_export_shows_a_system_prompt_set_midway_where_it_was_set(store, tmp_path: Path):
    app = make_app(store, FakeEngine(reply="ok"))
    target = tmp_path / "chat.md"
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "before")
        await reply_finished(pilot)
        await command(pilot, "/system Be brief.")
        await send(pilot, "after")
        await reply_finished(pilot)
        await command(pilot, f"/export {target}")
        await wait_until(pilot, target.exists, "the export")
    text = target.read_text()
    assert text.index("before") < text.index("System prompt changed to:") < text.index("after")
    assert text.index("# ") < text.index("before")  # not stated at the top as if from the start


async def test_bare_commands_are_not_recalled_by_up(store):
    app = make_app(store, FakeEngine(reply="ok"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "a question")
        await reply_finished(pilot)
        await command(pilot, "/retry")
        await reply_finished(pilot)
        await pilot.press("up")
        assert app.prompt.text == "a question"


async def test_the_palette_keeps_brackets_in_help_text(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        from textual.content import Content

        helps = {c.title: c.help for c in app.get_system_commands(app.screen)}
        assert "[remote]" in Content.from_markup(helps["/big"]).plain


async def test_model_names_are_read_again_when_typing_model_and_missing_ones_say_so(store):
    choices = [("fake-model", True)]
    app = make_app(store, FakeEngine(), list_models=lambda: list(choices))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        choices.append(("imported", False))  # `localchat import` ran in another terminal
        app.prompt.text = "/model i"
        hints = app.query_one("#hints")
        await wait_until(pilot, lambda: "imported" in str(hints.content), "the new name")
        assert "not downloaded" in str(hints.content)


async def test_pageup_while_typing_scrolls_the_conversation(store):
    app = make_app(store, FakeEngine(reply="\n\n".join(f"line {i}" for i in range(60))))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "long")
        await reply_finished(pilot)
        await pilot.pause()
        bottom = app.chat_log.scroll_y
        app.prompt.text = "typing"
        await pilot.press("pageup")
        await wait_until(pilot, lambda: app.chat_log.scroll_y < bottom, "the log to scroll up")
        assert app.prompt.text == "typing" and app.focused is app.prompt


async def test_copy_inside_tmux_goes_to_the_paste_buffer_and_says_so(store, tmp_path, monkeypatch):
    fake_tmux = tmp_path / "bin" / "tmux"
    fake_tmux.parent.mkdir()
    fake_tmux.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat > {tmp_path}/buffer\n")
    fake_tmux.chmod(fake_tmux.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake_tmux.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    app = make_app(store, FakeEngine(reply="copy me"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await reply_finished(pilot)
        await command(pilot, "/copy")
        await wait_until(pilot, lambda: any("tmux's paste buffer" in n for n in notices(app)), "the notice")
    assert (tmp_path / "buffer").read_text() == "copy me"
    assert (tmp_path / "args").read_text().split() == ["load-buffer", "-w", "-"]
    assert clipboard.osc52_sequence("x").startswith("\x1bPtmux;\x1b\x1b]52;c;")
