"""A small preview of each picture under its ``[image: …]`` line, where the terminal draws sixel or
kitty graphics: none without them (and never a query to a terminal that is not there), one per
picture when a renderer is forced with ``LOCALCHAT_IMAGE_PREVIEW``, within a few rows and the
log's width, decoded once per picture; a picture that cannot be read keeps only its line; a
reopened session previews its stored copies. The scripted engine for the UI."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fake_engine import SIZE, FakeEngine, command, make_app, ready, reply_finished, send, wait_until
from image_fixture import png

from localchat.tui import attached_files, graphics_support, image_previews
from localchat.tui.chat_log import UserMessage
from localchat.tui.graphics_support import PREVIEW_SETTING, prepare_previews, preview_renderer
from localchat.tui.image_previews import MAX_COLUMNS, MAX_ROWS, ImagePreview, preview_size

read_thumbnail = image_previews.read_thumbnail

PHOTO = png(640, 480, (0, 128, 255))
BANNER = png(1600, 100, (255, 200, 0))  # far wider than a message at 8 rows


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No renderer decided at launch, and no thumbnail kept from another test."""
    monkeypatch.setattr(graphics_support, "_prepared", [])
    monkeypatch.setattr(image_previews, "_thumbnails", type(image_previews._thumbnails)())


@pytest.fixture
def pictures(tmp_path, monkeypatch):
    """Two pictures in the working folder, and a model that reads them."""
    monkeypatch.setattr(attached_files, "model_reads_images", lambda model: 4)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "photo.png").write_bytes(PHOTO)
    (tmp_path / "banner.png").write_bytes(BANNER)


@pytest.fixture
def sixel(monkeypatch):
    monkeypatch.setenv(PREVIEW_SETTING, "sixel")


def previews(app) -> list[ImagePreview]:
    return list(app.chat_log.query(ImagePreview))


def drawn(app) -> list[ImagePreview]:
    """The previews whose picture is decoded, mounted and sized."""
    return [p for p in previews(app) if p.drawing is not None and p.drawing.is_mounted
            and p.drawing.size.height > 0]


def picture_lines(app) -> list[str]:
    return [str(line.render()) for line in app.chat_log.query("PictureLine")]


async def send_with_pictures(pilot, *names: str) -> None:
    app = pilot.app
    for name in names:
        await command(pilot, f"/image {name}")
    await wait_until(pilot, lambda: len(app.files.images) == len(names), "the pictures")
    await send(pilot, "what is in them?")
    await reply_finished(pilot)


def assert_small(preview: ImagePreview, message: UserMessage) -> None:
    assert preview.drawing is not None
    columns, rows = preview.drawing.size
    assert 1 <= rows <= MAX_ROWS
    assert 1 <= columns <= min(MAX_COLUMNS, message.content_size.width)


@pytest.mark.parametrize("setting", [None, "auto", "off", "bogus"])
async def test_no_preview_where_the_terminal_draws_no_pictures(store, pictures, monkeypatch, setting):
    if setting is not None:
        monkeypatch.setenv(PREVIEW_SETTING, setting)
    else:
        monkeypatch.delenv(PREVIEW_SETTING, raising=False)
    app = make_app(store, FakeEngine(reply="A photo."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send_with_pictures(pilot, "photo.png")
        assert picture_lines(app) == ["[image: photo.png 640x480]"]
        assert previews(app) == []


async def test_a_forced_renderer_previews_each_picture_small_and_within_the_log(store, pictures, sixel):
    app = make_app(store, FakeEngine(reply="A photo and a banner."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send_with_pictures(pilot, "photo.png", "banner.png")
        await wait_until(pilot, lambda: len(drawn(app)) == 2, "both previews drawn")
        message = app.chat_log.prompts()[-1]
        photo, banner = previews(app)
        assert [photo.ref.name, banner.ref.name] == ["photo.png", "banner.png"]
        # Each under the line naming it, the text last.
        assert [type(w).__name__ for w in message.children] == [
            "PictureLine", "ImagePreview", "PictureLine", "ImagePreview", "PromptText"]
        assert_small(photo, message)
        assert_small(banner, message)
        assert photo.drawing is not None and photo.drawing.size.height == MAX_ROWS
        assert banner.drawing is not None and banner.drawing.size.height < MAX_ROWS  # kept its shape


async def test_a_picture_is_decoded_once_however_often_it_is_shown(store, pictures, sixel, monkeypatch):
    decoded = []

    def counting(picture):
        decoded.append(1)
        return read_thumbnail(picture)

    monkeypatch.setattr(image_previews, "read_thumbnail", counting)
    app = make_app(store, FakeEngine(reply="Blue."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send_with_pictures(pilot, "photo.png")
        await wait_until(pilot, lambda: len(drawn(app)) == 1, "the first preview")
        await send_with_pictures(pilot, "photo.png")
        await wait_until(pilot, lambda: len(drawn(app)) == 2, "the second preview")
    assert len(decoded) == 1


async def test_a_reply_streaming_below_does_not_lay_the_preview_out_again(store, pictures, sixel,
                                                                           monkeypatch):
    engine = FakeEngine(reply="Blue.")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send_with_pictures(pilot, "photo.png")
        await wait_until(pilot, lambda: len(drawn(app)) == 1, "the preview")
        fits = []
        monkeypatch.setattr(ImagePreview, "_fit", lambda self: fits.append(self))
        engine.reply = " ".join(f"word{i}" for i in range(300))
        engine.token_delay = 0.002
        await send(pilot, "tell me more")
        await reply_finished(pilot)
        assert len(app.chat_log.last_reply().text) > 1000
        assert fits == []


async def test_a_reopened_session_previews_its_stored_pictures(store, pictures, sixel, tmp_path):
    app = make_app(store, FakeEngine(reply="Blue."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send_with_pictures(pilot, "photo.png")
    (tmp_path / "photo.png").unlink()  # only the session's own copy is left
    image_previews._thumbnails.clear()  # read from that copy, not from memory
    again = make_app(store, FakeEngine(reply="Still blue."), continue_last=True)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: len(drawn(again)) == 1, "the stored picture's preview")
        assert_small(previews(again)[0], again.chat_log.prompts()[0])


async def test_a_picture_that_cannot_be_read_keeps_only_its_line(store, pictures, sixel, tmp_path):
    app = make_app(store, FakeEngine(reply="Blue."))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send_with_pictures(pilot, "photo.png", "banner.png")
    (question, _) = store.turns(store.last_session().id)
    photo, banner = question.images
    store.image_path(photo).write_bytes(PHOTO[: len(PHOTO) // 2])  # truncated: no longer the picture
    store.image_path(banner).unlink()  # gone
    image_previews._thumbnails.clear()
    again = make_app(store, FakeEngine(reply="Hm."), continue_last=True)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: again.chat_log.prompts(), "the stored prompt")
        await wait_until(pilot, lambda: previews(again) == [], "the previews to give up")
        assert picture_lines(again) == ["[image: photo.png 640x480]", "[image: banner.png 1600x100]"]


def test_bytes_that_do_not_decode_give_no_thumbnail():
    assert read_thumbnail(lambda: PHOTO[:100]) is None
    assert read_thumbnail(lambda: b"not a picture") is None
    assert read_thumbnail(lambda: None) is None
    thumbnail = read_thumbnail(lambda: PHOTO)
    assert thumbnail is not None and thumbnail.size == (427, 320)  # within THUMBNAIL_BOX, its shape
    banner = read_thumbnail(lambda: BANNER)
    assert banner is not None and banner.size == (960, 60)


def test_preview_size_is_a_few_rows_in_the_pictures_proportions_within_the_room():
    cell = (10, 20)
    assert preview_size(640, 480, cell, 76) == (21, 8)  # 8 rows of 20 px: 160 px high, 213 wide
    assert preview_size(40, 30, cell, 76) == (5, 2)  # a small picture is not enlarged past a row
    assert preview_size(1600, 100, cell, 30) == (30, 1)  # a banner: as wide as the room, fewer rows
    assert preview_size(4000, 100, cell, 200) == (MAX_COLUMNS, 1)
    assert preview_size(100, 4000, cell, 76) == (1, MAX_ROWS)
    assert preview_size(640, 480, cell, 0) == (0, 0)


def test_auto_never_asks_a_terminal_once_the_app_may_be_running(monkeypatch):
    monkeypatch.delenv(PREVIEW_SETTING, raising=False)
    monkeypatch.setattr(graphics_support, "_ask_terminal", lambda: pytest.fail("asked the terminal"))
    assert preview_renderer() is None


def test_prepare_asks_nothing_where_stdout_is_not_a_terminal(monkeypatch):
    monkeypatch.setenv(PREVIEW_SETTING, "auto")
    monkeypatch.setattr(graphics_support, "_on_a_terminal", lambda: False)
    monkeypatch.setattr(graphics_support, "_ask_terminal", lambda: pytest.fail("asked the terminal"))
    assert prepare_previews() is None
    assert preview_renderer() is None


def test_kitty_is_not_forced_onto_a_stdout_that_is_not_a_terminal(monkeypatch):
    # textual-image writes kitty pictures to stdout itself: into a pipe they would be garbage.
    monkeypatch.setenv(PREVIEW_SETTING, "kitty")
    monkeypatch.setattr(graphics_support, "_is_tty", lambda stream: False)
    assert preview_renderer() is None
    monkeypatch.setenv(PREVIEW_SETTING, "sixel")
    assert preview_renderer() == "sixel"


def test_what_prepare_decided_holds_for_the_whole_run(monkeypatch):
    monkeypatch.setenv(PREVIEW_SETTING, "auto")
    monkeypatch.setattr(graphics_support, "_on_a_terminal", lambda: True)
    monkeypatch.setattr(graphics_support, "_ask_terminal", lambda: "kitty")
    monkeypatch.setattr(graphics_support, "_load_widgets", lambda: True)
    assert prepare_previews() == "kitty"
    monkeypatch.setenv(PREVIEW_SETTING, "off")
    assert preview_renderer() == "kitty"


def ask_on_a_terminal(answers: dict[bytes, bytes], cells: tuple[int, int, int, int]) -> str:
    """What ``prepare_previews`` decides in a process on a pseudo-terminal of ``cells`` (rows,
    columns, pixels wide, pixels high) that answers each query in ``answers`` (by a piece of it)
    with its bytes, as a terminal would; the process's whole output."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *cells))
    code = "from localchat.tui.graphics_support import prepare_previews; print('->', prepare_previews())"
    env = dict(os.environ, TERM="xterm-256color", **{PREVIEW_SETTING: "auto"})
    child = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave,
                             env=env, start_new_session=True)
    os.close(slave)
    output, deadline = b"", time.monotonic() + 20
    try:
        while not (b"->" in output and output.endswith(b"\n")) and time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    output += os.read(master, 4096)
                except OSError:  # the child ended
                    break
                for query in [q for q in answers if q in output]:
                    os.write(master, answers.pop(query))
        child.wait(10)
    finally:
        os.close(master)
    return output.decode(errors="replace")


SIXEL_TERMINAL = {b"\x1b[c": b"\x1b[?62;4;22c"}  # primary attributes with 4: sixel
KITTY_TERMINAL = {b"\x1b[c": b"\x1b[?62;22c", b"a=q": b"\x1b_Gi=1;OK\x1b\\"}  # its query's OK


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX's")
@pytest.mark.parametrize("answers, cells, decided", [
    (SIXEL_TERMINAL, (24, 80, 800, 480), "sixel"),
    (KITTY_TERMINAL, (24, 80, 800, 480), "kitty"),
    ({}, (24, 80, 800, 480), "None"),  # a terminal that answers nothing: no wait past the timeouts
    (SIXEL_TERMINAL, (0, 0, 0, 0), "None"),  # textual-image divides by the columns: no previews
])
def test_auto_asks_the_terminal_at_launch_and_takes_what_it_draws(answers, cells, decided):
    started = time.monotonic()
    output = ask_on_a_terminal(dict(answers), cells)
    assert f"-> {decided}" in output
    assert time.monotonic() - started < 15
