"""Finished blocks of a streaming reply shown as pictures of themselves (``tui/pictures``): the
screen shows the same cells with the pictures as with the real widgets, a picture holds only its
block's own widgets, and the real widgets come back when the user needs them."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fake_engine import held_mid_reply
from test_tui_stream import many_blocks
from textual.app import App
from textual.containers import VerticalScroll
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownTable

from localchat.tui.pictures import Picture, picture_of


def cells(app) -> list[list[tuple[str, str]]]:
    """The chat log on screen, cell by cell: (character, style). (The prompt's cursor blinks.)"""
    region = app.chat_log.region
    return [[(char, str(segment.style)) for segment in strip.crop(region.x, region.right)
             for char in segment.text]
            for strip in app.screen._compositor.render_strips()[region.y:region.bottom]]


def pictures(app) -> list[Picture]:
    return [p for p in app.chat_log.last_reply().body.query(Picture) if p.display]


@asynccontextmanager
async def paused_mid_reply(store, tokens: int = 900):
    """The app at 100x40 with a many-block reply held after ``tokens``, after two more of the
    frames' folding passes (a block is pictured at the pass after the one that saw it
    finished); the reply is stopped at the end."""
    async with held_mid_reply(store, many_blocks(1500), tokens, size=(100, 40), token_delay=0.004) as pilot:
        app = pilot.app
        await pilot.pause(0.8)  # the last paced frame
        for _ in range(2):
            await app.chat_log.fold_scrolled_away(app.chat_log.last_reply())
            await pilot.pause()
        yield pilot


async def test_a_streaming_reply_with_its_finished_blocks_as_pictures_looks_as_with_the_real_widgets(store):
    async with paused_mid_reply(store) as pilot:
        app = pilot.app
        shown = pictures(app)
        assert shown  # tables, lists and code blocks in view are pictures
        with_pictures = cells(app)
        app.chat_log.unfold()
        await pilot.pause()
        body = app.chat_log.last_reply().body
        assert not body.query(Picture) and all(p.original.display for p in shown)
        assert cells(app) == with_pictures


async def test_a_press_on_a_picture_brings_the_real_widgets_back(store):
    async with paused_mid_reply(store) as pilot:
        app = pilot.app
        log = app.chat_log.region
        picture = next(p for p in pictures(app) if log.contains_region(p.region))
        region = picture.region
        await pilot.mouse_down(offset=(region.x + 2, region.y))
        await pilot.pause()
        assert not pictures(app) and picture.original.display


class TableUnderToast(App):
    CSS = "VerticalScroll { height: 1fr; }"
    TABLE = "\n".join(["| name | value |", "|---|---|", *(f"| row {i} | {i * i} |" for i in range(4))])

    def compose(self):
        with VerticalScroll():
            yield Markdown("\n\n".join(["Some words."] * 6 + [self.TABLE]))


async def test_a_picture_holds_its_blocks_own_widgets_not_a_toast_over_it():
    app = TableUnderToast()
    async with app.run_test(size=(60, 24), notifications=True) as pilot:
        await pilot.pause()
        table = app.query_one(MarkdownTable)
        app.notify("TOAST OVER THE TABLE", timeout=30)
        await pilot.pause(0.3)
        region = table.region
        screen = [strip.crop(region.x, region.right).text
                  for strip in app.screen._compositor.render_strips()[region.y:region.bottom]]
        assert any("TOAST" in line for line in screen)
        strips = picture_of(table)
        assert strips is not None and len(strips) == region.height
        lines = [strip.text for strip in strips]
        assert not any("TOAST" in line for line in lines)
        assert "row 3" in "".join(lines)
        app.clear_notifications()
        await pilot.pause(0.5)
        screen = [strip.crop(region.x, region.right).text
                  for strip in app.screen._compositor.render_strips()[region.y:region.bottom]]
        assert lines == screen


async def test_a_block_partly_out_of_view_has_no_picture():
    app = TableUnderToast()
    async with app.run_test(size=(60, 12)) as pilot:
        await pilot.pause()
        table = app.query_one(MarkdownTable)
        assert table.region.bottom > 12 or table.region.y < 0
        assert picture_of(table) is None


async def test_pictures_give_way_to_the_real_widgets_when_the_terminal_narrows(store):
    async with paused_mid_reply(store) as pilot:
        app = pilot.app
        shown = pictures(app)
        assert shown
        await pilot.resize_terminal(80, 40)
        await pilot.pause()
        assert not pictures(app) and all(p.original.display for p in shown)
