"""The app with a scripted engine: streaming, stopping, the status bar, the prompt, and errors
shown as notices. Each test waits for what the user would see, never for a fixed time."""

from __future__ import annotations

import re
import threading

import pytest
from fake_engine import (
    SIZE,
    FakeEngine,
    make_app,
    notices,
    ready,
    reply_finished,
    screen_lines,
    send,
    split_tokens,
    wait_until,
)

from localchat.errors import ModelNotFound
from localchat.tui.chat_log import QueuedPrompt, ReplyView, UserMessage
from localchat.tui.pacing import FramePacer
from localchat.tui.screens import ConfirmScreen
from localchat.tui.status import render_status


def status_text(app) -> str:
    return "\n".join(render_status(app.status.info))


def caption(reply: ReplyView) -> str:
    return str(reply.query_one(".caption").content)


async def test_a_reply_streams_as_markdown_and_is_saved_with_model_and_timings(store):
    script = "Here:\n\n```python\nprint('hi')\n```\n\nDone."
    app = make_app(store, FakeEngine(reply=script))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Show me code")
        await reply_finished(pilot)

        reply = app.chat_log.last_reply()
        assert reply.text == script
        assert reply.body.source == reply.text  # the final full render has the whole reply
        assert str(app.chat_log.query(UserMessage).last().body.content) == "Show me code"
        assert caption(reply).startswith(f"fake-model · {len(split_tokens(script))} tokens · ")
        assert app.status.info.state == "idle"

    prompt, answer = store.turns(store.last_session().id)
    assert (prompt.role, prompt.content) == ("user", "Show me code")
    assert (answer.role, answer.model, answer.stopped, answer.finish_reason) == ("assistant", "fake-model", False, "stop")
    assert answer.timings.predicted_n == len(split_tokens(script)) and answer.timings.ttft_ms > 0


class _CostlyFrames(FramePacer):
    """Every redraw waits a minute, as if the screen were very expensive to repaint."""

    def wait(self) -> float:
        return 60.0


async def test_the_first_token_is_shown_at_once_even_when_redraws_are_held_back(store):
    engine = FakeEngine(reply="one two three", hold_after=1)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.turns.pacer = _CostlyFrames()
        await send(pilot, "count")
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "one", "the first token")
        assert app.turns.current.meter.first_token_at is not None
        await pilot.press("escape")


async def test_typing_without_a_pause_still_hands_the_draft_over_every_second(store, monkeypatch):
    from localchat.tui import draft

    now = [100.0]
    monkeypatch.setattr(draft, "_clock", lambda: now[0])
    monkeypatch.setattr(draft, "TYPING_PAUSE_S", 60.0)  # the pause never comes
    engine = FakeEngine()
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("h")
        now[0] += 0.5
        await pilot.press("e")
        now[0] += 0.6  # 1.1 s of typing since the first key
        await pilot.press("y")
        await wait_until(pilot, lambda: engine.prepared, "a draft step")
        assert [m[-1]["content"] for m in engine.prepared] == ["hey"]


async def test_esc_stops_the_reply_within_one_token_and_keeps_it_marked_stopped(store):
    engine = FakeEngine(reply="one two three four five six seven", hold_after=3)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "count")
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "one two three", "three tokens")
        assert app.status.info.state == "generating"

        await pilot.press("escape")
        await reply_finished(pilot)

        reply = app.chat_log.last_reply()
        assert reply.text == "one two three"
        assert reply.has_class("-stopped") and caption(reply).endswith("■ stopped")
        assert app.status.info.state == "stopped"

    saved = store.turns(store.last_session().id)[-1]
    assert (saved.content, saved.stopped, saved.finish_reason) == ("one two three", True, "aborted")


async def test_the_turn_after_a_stop_gives_the_model_the_stopped_reply(store):
    engine = FakeEngine(reply="alpha beta gamma", hold_after=1)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "alpha", "one token")
        await pilot.press("escape")
        await reply_finished(pilot)
        engine.hold_after = None
        await send(pilot, "second")
        await reply_finished(pilot)

    assert engine.submitted[-1][-3:] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "alpha"},
        {"role": "user", "content": "second"},
    ]


async def test_ctrl_c_stops_a_streaming_reply_and_when_idle_asks_before_quitting(store):
    app = make_app(store, FakeEngine(reply="a b c d e", hold_after=2))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "a b", "two tokens")
        await pilot.press("ctrl+c")
        await reply_finished(pilot)
        assert app.chat_log.last_reply().has_class("-stopped")

        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the quit question")
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the question to close")
        assert app.is_running

        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the quit question")
        await pilot.press("y")
        await wait_until(pilot, lambda: not app.is_running, "the app to exit")


async def test_quitting_during_a_reply_saves_it_as_stopped(store):
    app = make_app(store, FakeEngine(reply="partial reply here", hold_after=2))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "partial reply", "two tokens")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: not app.is_running, "the app to exit")
    saved = store.turns(store.last_session().id)[-1]
    assert (saved.content, saved.stopped) == ("partial reply", True)


async def test_status_bar_shows_model_offload_state_ttft_tpot_speed_cache_and_context(store):
    app = make_app(store, FakeEngine(gpu_layers=28, n_layers=28, reply="a b c d"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "fake-model · GPU 28/28 │ idle" in status_text(app)
        await send(pilot, "hello there")
        await reply_finished(pilot)
        first, second = render_status(app.status.info)
        assert first.startswith("fake-model · GPU 28/28 │ idle │ ctx ")
        assert "/4096" in first and first.endswith("│ local")
        assert second.startswith("TTFT ") and " ms │ TPOT " in second and " ms │ " in second
        assert " tok/s │ reused 0 · new " in second
        timings = store.turns(store.last_session().id)[-1].timings
        assert app.status.info.n_ctx_used == timings.n_ctx_used
        assert app.status.info.ttft_ms == pytest.approx(timings.ttft_ms, abs=0.001)  # stored rounded


async def test_loading_shows_progress_and_a_prompt_sent_meanwhile_is_queued_then_sent(store):
    gate = threading.Event()
    app = make_app(store, FakeEngine(load_gate=gate))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.status.info.state == "loading 100%", "load progress")
        await send(pilot, "are you there?")
        assert app.prompt.text == ""  # it left the input: it is queued, shown as such
        queued = app.chat_log.query(QueuedPrompt)
        assert [q.text for q in queued] == ["are you there?"] and "queued #1" in queued.first().border_title
        gate.set()
        await ready(pilot)
        await reply_finished(pilot)
        assert not app.chat_log.query(QueuedPrompt)
        assert str(app.chat_log.query(UserMessage).last().body.content) == "are you there?"
    assert [t.content for t in store.turns(store.last_session().id)][0] == "are you there?"


async def test_a_missing_model_is_a_notice_that_offers_the_pull_command(store):
    def missing(ref):
        raise ModelNotFound("model smollm2-135m is not downloaded; run `localchat pull smollm2-135m`")

    app = make_app(store, engine_factory=missing)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.status.info.state == "no model", "the load to fail")
        notice = str(app.chat_log.query(".notice").last().content)
        assert "run `localchat pull smollm2-135m`" in notice
        await send(pilot, "hello")
        assert app.prompt.text == "hello"
        assert any("No model is loaded" in n for n in notices(app))


async def test_a_load_failure_is_a_readable_notice_not_a_traceback(store):
    app = make_app(store, FakeEngine(load_error="not enough memory for 8192 tokens of context"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.status.info.state == "no model", "the load to fail")
        assert "not enough memory" in str(app.chat_log.query(".notice").last().content)
        assert app.is_running


async def test_a_failed_turn_marks_the_reply_and_keeps_the_prompt(store):
    app = make_app(store, FakeEngine(turn_error="the conversation needs 5000 tokens but the context holds 4096"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "long question")
        await reply_finished(pilot)
        reply = app.chat_log.last_reply()
        assert reply.has_class("-failed") and "context holds 4096" in caption(reply)
        assert app.status.info.state == "idle"
    assert [t.content for t in store.turns(store.last_session().id)] == ["long question"]


async def test_enter_sends_ctrl_j_adds_a_line_and_pasted_newlines_do_not_send(store):
    engine = FakeEngine()
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"line one", "ctrl+j", *"line two")
        assert app.prompt.text == "line one\nline two"
        app.prompt.insert("\npasted\ntext")
        assert not engine.submitted
        await pilot.press("enter")
        await reply_finished(pilot)
        assert engine.submitted[0][-1]["content"] == "line one\nline two\npasted\ntext"
        assert app.prompt.text == ""


async def test_up_recalls_earlier_prompts_including_those_of_earlier_runs(store):
    session = store.create_session()
    store.add_user_turn(session.id, "from yesterday")
    app = make_app(store, FakeEngine(reply="ok"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "today")
        await reply_finished(pilot)
        await pilot.press(*"draft")
        await pilot.press("up")
        assert app.prompt.text == "today"
        await pilot.press("up")
        assert app.prompt.text == "from yesterday"
        await pilot.press("down", "down")
        assert app.prompt.text == "draft"


async def test_messages_sent_while_a_reply_streams_are_queued_in_order_and_esc_removes_the_newest(store):
    release = threading.Event()
    engine = FakeEngine(reply=lambda m: "re: " + m[-1]["content"], hold_after=1, release=release)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await wait_until(pilot, lambda: app.chat_log.last_reply().text == "re:", "a token")
        await pilot.press(*"second")
        await pilot.press("enter")
        await send(pilot, "third")
        await send(pilot, "oops")
        assert [q.text for q in app.chat_log.query(QueuedPrompt)] == ["second", "third", "oops"]

        await pilot.press("escape")  # takes back the newest queued message, not the reply
        assert [q.text for q in app.chat_log.query(QueuedPrompt)] == ["second", "third"]
        assert app.prompt.text == "oops" and app.turns.current is not None
        app.prompt.text = ""

        release.set()
        await wait_until(pilot, lambda: len(engine.submitted) == 3 and app.turns.current is None, "the queue to drain")
        await reply_finished(pilot)
    assert [m[-1]["content"] for m in engine.submitted] == ["first", "second", "third"]
    assert [t.content for t in store.turns(store.last_session().id)] == [
        "first", "re: first", "second", "re: second", "third", "re: third"]


async def test_the_layout_fits_80_by_24_with_every_part_on_screen(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        screen = app.screen.region
        for widget in (app.chat_log, app.prompt, app.status):
            assert screen.contains_region(widget.region), widget
        assert app.chat_log.region.height >= 15
        assert app.status.region.height == 2


async def test_no_color_is_respected(store, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.no_color


async def test_the_chosen_theme_is_remembered(store):
    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        app.theme = "nord"
        await pilot.pause()
    assert store.get_setting("theme") == "nord"
    again = make_app(store, FakeEngine())
    async with again.run_test(size=SIZE):
        assert again.theme == "nord"


async def test_help_opens_with_f1_and_lists_every_command(store):
    from localchat.tui.screens import HelpScreen
    from localchat.tui.slash_commands import COMMANDS

    app = make_app(store, FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        from textual.widgets import Markdown

        source = app.screen.query_one(Markdown).source
        for command in COMMANDS:
            assert command.usage in source
        assert "TTFT" in source and "Ctrl+J" in source
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen), "help to close")


def test_fake_tokens_rebuild_the_reply_exactly():
    text = "Hello,  world!\n\n```py\nx = 1\n```"
    assert "".join(split_tokens(text)) == text


async def test_after_a_failed_load_another_model_can_be_chosen_and_the_old_notice_goes(store):
    engines = {"broken": FakeEngine("broken", load_error="unsupported file"), "fake-model": FakeEngine()}
    app = make_app(store, engine_factory=lambda ref: engines[ref or "broken"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.status.info.state == "no model", "the load to fail")
        await send(pilot, "/model fake-model")
        await ready(pilot)
        assert not app.chat_log.query(".notice")
        assert status_text(app).startswith("fake-model · CPU │ idle")


@pytest.mark.parametrize("columns", [60, 40])
async def test_a_narrow_status_bar_shows_whole_fields_only(store, columns):
    app = make_app(store, FakeEngine("smollm2-135m", reply="Sure, here is a short answer to that."))
    async with app.run_test(size=(columns, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "hello there, how are you doing today?")
        await reply_finished(pilot)
        await pilot.pause()
        region = app.status.region
        first, second = (line.strip() for line in screen_lines(app)[region.y:region.y + 2])
        used = app.status.info.n_ctx_used
    assert "…" not in first + second
    if columns == 60:  # the context bar's glyphs went first, then "· new N"
        assert first.split(" │ ") == ["smollm2-135m · CPU", "idle", f"ctx {used}/4096 0%", "local"]
        fields = second.split(" │ ")
        assert len(fields) == 4 and fields[3] == "reused 0" and re.fullmatch(r"[\d.]+ tok/s", fields[2])
    else:  # then the backend, the route, tokens/s
        assert first.split(" │ ") == ["smollm2-135m", "idle", f"ctx {used}/4096 0%"]
        fields = second.split(" │ ")
        assert len(fields) == 3 and fields[2] == "reused 0"
    assert re.fullmatch(r"TTFT \d+ ms", fields[0]) and re.fullmatch(r"TPOT [\d.]+ ms", fields[1])


@pytest.mark.parametrize("columns", [120, 60, 40])
async def test_the_key_hint_under_the_prompt_is_never_cut(store, columns):
    app = make_app(store, FakeEngine("smollm2-135m"))
    async with app.run_test(size=(columns, 20)) as pilot:
        await ready(pilot)
        await pilot.pause()
        region = app.prompt.region
        bottom = screen_lines(app)[region.y + region.height - 1]  # the prompt's lower border
    assert "╰" in bottom and "…" not in bottom and "F1 help" in bottom
    assert ("PgUp/PgDn scroll" in bottom) == (columns >= 63)
