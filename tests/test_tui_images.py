"""Pictures in the app: ``/image PATH``, a pasted or dropped path, ``@photo.png``; the chip above
the input, Backspace and ``/image clear``; the line naming each picture in the conversation,
stored with the session; bad pictures and a model that reads none as one-line notices. The
scripted engine for the UI; the real engine and the synthetic projector end to end."""

from __future__ import annotations

from contextlib import asynccontextmanager

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
from image_fixture import png
from projector_fixture import write_mlp_projector
from textual import events

from localchat.engine.image_records import digest
from localchat.engine.vision import image_support
from localchat.tui import attached_files
from localchat.tui.attached_files import AttachmentChips
from localchat.tui.chat_log import UserMessage
from localchat.tui.prompt import CommandHints

RED = png(40, 30, (255, 0, 0))
SLOW = 120.0  # seconds: the real model on a shared 2-core machine


@pytest.fixture
def reads_images(monkeypatch):
    """The model in use reads images, four tokens a picture (the fake has no registry entry)."""
    monkeypatch.setattr(attached_files, "model_reads_images", lambda model: 4)


@pytest.fixture
def red(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "red.png").write_bytes(RED)
    return tmp_path / "red.png"


@asynccontextmanager
async def ready_app(store, reply: str):
    """The app over a scripted engine answering ``reply``, ready for input: (engine, app, pilot)."""
    engine = FakeEngine(reply=reply)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        yield engine, app, pilot


def chips(app) -> str:
    widget = app.query_one(AttachmentChips)
    return str(widget.render()) if widget.display else ""


def prompts(app) -> list[str]:
    """Each prompt as shown: the lines naming its pictures, then its text."""
    return ["\n".join(str(part.render()) for part in m.query("PictureLine, PromptText"))
            for m in app.query(UserMessage)]


async def test_image_command_attaches_a_picture_that_goes_with_the_next_message(store, red, reads_images):
    async with ready_app(store, "Red.") as (engine, app, pilot):
        await command(pilot, f"/image {red}")
        await wait_until(pilot, lambda: "red.png 40×30 · 4 tokens" in chips(app), "the chip")
        await send(pilot, "What colour is it?")
        await reply_finished(pilot)
        assert prompts(app)[-1] == "[image: red.png 40x30]\nWhat colour is it?"
        assert chips(app) == ""
    last = engine.submitted[-1][-1]
    assert last["images"] == [RED] and last["content"] == "What colour is it?"
    (question, _) = store.turns(store.last_session().id)
    assert question.images[0].sha256 == digest(RED)


async def test_an_attached_picture_is_prefilled_while_the_message_is_typed(store, red, reads_images):
    async with ready_app(store, "Red.") as (engine, app, pilot):
        await command(pilot, f"/image {red}")
        # No words yet: the picture alone is prepared, so it is encoded while they are typed.
        await wait_until(pilot, lambda: any(m[-1].get("images") == [RED] for m in engine.prepared),
                         "the picture prepared")
        assert engine.prepared[-1][-1]["content"] == ""
        await pilot.press(*"What colour")
        await wait_until(pilot, lambda: engine.prepared[-1][-1]["content"] == "What colour",
                         "the words prepared")
        assert engine.prepared[-1][-1]["images"] == [RED]


async def test_a_pasted_picture_path_attaches_it_and_other_pastes_are_text(store, red, reads_images):
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.post_message(events.Paste(f"'{red}'"))
        await wait_until(pilot, lambda: "red.png" in chips(app), "the chip")
        assert app.prompt.text == ""
        app.post_message(events.Paste("just some words"))
        await wait_until(pilot, lambda: app.prompt.text == "just some words", "the text")
        app.prompt.text = ""
        app.post_message(events.Paste(f"file://{red}"))
        await wait_until(pilot, lambda: len(app.files.images) == 2, "the second picture")
        app.prompt.text = "/image "
        app.prompt.move_cursor(app.prompt.document.end)
        app.post_message(events.Paste(str(red)))  # the command's argument, not an attachment
        await wait_until(pilot, lambda: app.prompt.text == f"/image {red}", "the argument")
        assert len(app.files.images) == 2


async def test_backspace_in_the_empty_input_and_image_clear_remove_pictures(store, red, reads_images):
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/image red.png")
        await command(pilot, "/image red.png")
        await wait_until(pilot, lambda: len(app.files.images) == 2, "two pictures")
        await pilot.press("backspace")
        await wait_until(pilot, lambda: len(app.files.images) == 1, "one removed")
        await command(pilot, "/image clear")
        assert app.files.images == [] and chips(app) == ""


async def test_an_at_mention_of_a_picture_attaches_it_at_enter(store, red, reads_images):
    async with ready_app(store, "Red.") as (engine, app, pilot):
        await send(pilot, "What is in @red.png?")
        await reply_finished(pilot)
    assert engine.submitted[-1][-1]["images"] == [RED]


async def test_tab_completes_picture_paths_after_image(store, red, reads_images):
    (red.parent / "notes.txt").write_text("not a picture")
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.prompt.text = "/image re"
        app.prompt.move_cursor(app.prompt.document.end)
        await pilot.press("tab")
        assert app.prompt.text == "/image red.png"
        app.prompt.text = "/image "
        await pilot.pause()
        hints = str(app.query_one(CommandHints).render())
        assert "red.png" in hints and "notes.txt" not in hints


@pytest.mark.parametrize("data, why", [(b"plain text, not a picture", "is not an image"),
                                       (RED[:-30], "damaged or truncated PNG")])
async def test_a_bad_picture_is_a_one_line_notice_and_the_session_goes_on(store, tmp_path, monkeypatch,
                                                                          reads_images, data, why):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.png").write_bytes(data)
    async with ready_app(store, "Fine.") as (engine, app, pilot):
        await command(pilot, "/image bad.png")
        await wait_until(pilot, lambda: any(why in n for n in notices(app)), "the notice")
        (notice,) = [n for n in notices(app) if why in n]
        assert "\n" not in notice and app.files.images == []
        await send(pilot, "hello")
        await reply_finished(pilot)
    assert "images" not in engine.submitted[-1][-1]


async def test_a_model_without_a_projector_names_the_models_that_read_images(store, red):
    app = make_app(store)  # the configured default, SmolLM2-135M, reads none
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/image red.png")
        await wait_until(pilot, lambda: any("does not read images" in n for n in notices(app)),
                         "the notice")
        assert app.files.images == []


async def test_a_reopened_session_shows_which_pictures_its_messages_had(store, red, reads_images):
    app = make_app(store, FakeEngine(reply="Red."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/image red.png")
        await wait_until(pilot, lambda: app.files.images, "the picture")
        await send(pilot, "colour?")
        await reply_finished(pilot)
    red.unlink()  # the original is gone: the session has its own copy
    again = make_app(store, FakeEngine(reply="Still red."), continue_last=True)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: prompts(again), "the stored prompt")
        assert prompts(again)[0] == "[image: red.png 40x30]\ncolour?"
        await send(pilot, "sure?")
        await reply_finished(pilot)
        engine = again.models.engine
    assert engine.submitted[-1][0]["images"] == [RED]


@pytest.mark.model
@pytest.mark.skipif(not image_support().available, reason="no libmtmd in this build")
async def test_the_real_engine_answers_about_a_picture_and_a_reopened_session_does_not_encode_it_again(
        test_model_path, tmp_path, red, capsys):
    from localchat.cli import main
    from localchat.engine.options import Sampling
    from localchat.store import Store
    from localchat.tui.app import LocalChatApp

    projector = write_mlp_projector(tmp_path / "mmproj-smol.gguf")
    assert main(["import", str(test_model_path), "--name", "smol", "--mmproj", str(projector)]) == 0
    capsys.readouterr()

    def app_on(store: Store, **options) -> LocalChatApp:
        return LocalChatApp(store=store, model="smol", list_models=list,
                            sampling_factory=lambda: Sampling(temperature=0.0, max_tokens=12, seed=0),
                            **options)

    def last_timings(store: Store):
        return store.turns(store.last_session().id)[-1].timings

    with Store.open() as store:
        app = app_on(store)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model", timeout=SLOW)
            await command(pilot, "/image red.png")
            # The projector's header says 4 tokens (28-pixel pictures, 14-pixel patches).
            await wait_until(pilot, lambda: "red.png 40×30 · 4 tokens" in chips(app), "the chip")
            await send(pilot, "What colour is this picture?")
            await wait_until(pilot, lambda: app.turns.current is None and app.chat_log.last_reply()
                             and app.chat_log.last_reply().finished, "the answer", timeout=SLOW)
            assert app.chat_log.last_reply().text.strip()
            assert prompts(app)[-1].startswith("[image: red.png 40x30]\n")
            # Encoded once: while the message was typed (the draft), or by the turn.
            drafted = sum(t.images_n for t in app.conversation.chat.draft.step_timings)
        first = last_timings(store)
        assert first.images_n + drafted == 1

        again = app_on(store, continue_last=True)
        async with again.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: again.models.engine is not None, "the model", timeout=SLOW)
            await send(pilot, "Are you sure?")
            await wait_until(pilot, lambda: again.turns.current is None and len(prompts(again)) == 2
                             and again.chat_log.last_reply().finished, "the second answer", timeout=SLOW)
        second = last_timings(store)
    # The saved cache came back with the picture's cells: nothing encoded, only the new text read.
    assert second.images_n == 0 and second.cache_n > first.prompt_n - 2


async def test_retry_and_an_edit_send_the_prompt_again_with_its_pictures(store, red, reads_images):
    async with ready_app(store, "Red.") as (engine, app, pilot):
        await command(pilot, "/image red.png")
        await wait_until(pilot, lambda: app.files.images, "the picture")
        await send(pilot, "colour?")
        await reply_finished(pilot)
        await command(pilot, "/retry")
        await reply_finished(pilot)
        assert engine.submitted[-1][-1]["images"] == [RED]
        await pilot.press("alt+up", "up")  # the prompt
        await pilot.press("e")
        app.prompt.text = "which colour?"
        await pilot.press("enter")
        await reply_finished(pilot)
        assert prompts(app)[-1].startswith("[image: red.png 40x30]\nwhich colour?")
    assert engine.submitted[-1][-1] == {"role": "user", "content": "which colour?", "images": [RED]}
