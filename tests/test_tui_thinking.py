"""The app with a reasoning model (scripted): the "Thinking…" block streams, folds when the answer
starts, opens with Ctrl+T; /think sets the switch; the status bar says when the answer began."""

from __future__ import annotations

import threading

from fake_engine import SIZE, FakeEngine, make_app, notices, ready, reply_finished, send, wait_until

from localchat.tui.chat_log import ReplyView
from localchat.tui.status import render_status
from localchat.tui.thinking import ThinkingBlock

SCRIPT = "<think> The user wants a route. The train is fastest. </think> Take the **train**."
REASONING = "The user wants a route. The train is fastest."


def block_of(reply: ReplyView) -> ThinkingBlock:
    assert reply.thinking is not None
    return reply.thinking


async def test_reasoning_streams_open_then_folds_when_the_answer_starts(store):
    release = threading.Event()
    app = make_app(store, FakeEngine(reply=SCRIPT, hold_after=4, release=release))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "How do I get there?")
        await wait_until(pilot, lambda: app.chat_log.last_reply().thinking is not None
                         and "wants" in app.chat_log.last_reply().thinking.text, "reasoning on screen")

        block = block_of(app.chat_log.last_reply())
        assert block.streaming and not block.collapsed and block.title == "Thinking…"
        assert app.status.info.state == "thinking"
        assert app.chat_log.last_reply().text == ""  # nothing of it reached the answer

        release.set()
        await reply_finished(pilot)
        reply = app.chat_log.last_reply()
        assert block.collapsed and not block.streaming
        assert block.text == REASONING
        assert block.title.startswith("Thought · ")
        assert reply.text == "Take the **train**." and reply.body.source == reply.text
        assert "answer" in render_status(app.status.info)[1]

    answer = store.turns(store.last_session().id)[-1]
    assert answer.content == SCRIPT  # the saved session keeps the reasoning
    assert answer.timings.thinking_n > 0


async def test_ctrl_t_opens_every_reasoning_block_and_is_remembered(store):
    app = make_app(store, FakeEngine(reply=SCRIPT))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Route?")
        await reply_finished(pilot)
        block = block_of(app.chat_log.last_reply())
        assert block.collapsed

        await pilot.press("ctrl+t")
        assert not block.collapsed
        await pilot.press("ctrl+t")
        assert block.collapsed
        await pilot.press("ctrl+t")
    assert store.get_setting("show_thinking") == "yes"

    again = make_app(store, FakeEngine(reply=SCRIPT), continue_last=True)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: again.chat_log.last_reply() is not None, "the stored turns")
        reply = again.chat_log.last_reply()
        block = block_of(reply)
        assert not block.collapsed and block.text == REASONING  # shown open, as chosen
        assert reply.text == "Take the **train**."


async def test_the_palette_offers_the_thinking_toggle(store):
    app = make_app(store, FakeEngine(reply=SCRIPT))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = [command.title for command in app.get_system_commands(app.screen)]
    assert "Show or hide thinking" in titles and "/think" in titles


async def test_think_command_sets_the_switch_for_the_next_turns(store):
    engine = FakeEngine(reply="Fine.", thinking_switch=True)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "/think off")
        await send(pilot, "Hi")
        await reply_finished(pilot)
        assert engine.samplings[-1].thinking == "off"
        assert "Thinking off from the next message." in notices(app)

        await send(pilot, "/think")
        assert any(n.startswith("Thinking: off (fake-model has a thinking switch)") for n in notices(app))
        await send(pilot, "/think sometimes")
        assert "Usage: /think on|off|auto" in notices(app)

        await send(pilot, "/model other-model")  # a model switch keeps the choice
        await ready(pilot)
        await wait_until(pilot, lambda: app.models.loading is None, "the model to load again")
        await send(pilot, "Again")
        await reply_finished(pilot)
        assert engine.samplings[-1].thinking == "off"


async def test_think_on_a_model_without_a_switch_says_so(store):
    app = make_app(store, FakeEngine(reply="Fine."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "/think on")
    assert "fake-model has no thinking switch: /think on applies to models that have one." in notices(app)


async def test_copy_and_export_keep_the_answer_apart_from_the_reasoning(store):
    app = make_app(store, FakeEngine(reply=SCRIPT))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Route?")
        await reply_finished(pilot)
        conversation = app.conversation
        assert conversation.last_reply() == "Take the **train**."
        exported = conversation.to_markdown()
    assert "<details><summary>Thinking</summary>" in exported
    assert "> " + REASONING in exported and "Take the **train**." in exported


def test_mailbox_merges_runs_of_reasoning_and_of_answer_apart():
    from localchat.events import Done, Thinking, Token
    from localchat.tui.messages import ThinkingRun, TokenRun, merge_tokens

    done = Done("x", "stop")
    merged = merge_tokens([Thinking("a"), Thinking("b"), Token("c"), Token("d"), Thinking("e"), done])

    assert merged == [ThinkingRun("ab", 2), TokenRun("cd", 2), ThinkingRun("e", 1), done]
