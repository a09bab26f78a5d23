"""A long reply streams at the pacer's interval, each frame doing work that does not grow with
the reply, and ends as a one-shot render of the same Markdown would draw it. Headless, with the
scripted engine; work is counted (characters parsed, lines rendered, widgets laid out), never
timed."""

from __future__ import annotations

import time

import pytest
from fake_engine import (
    FakeEngine,
    held_mid_reply,
    make_app,
    ready,
    reply_finished,
    screen_lines,
    send,
    split_tokens,
    wait_until,
)
from markdown_it import MarkdownIt
from textual.app import App
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.screen import Screen
from textual.widget import Widget

from localchat.bench import scripted_engine as bench_shapes
from localchat.tui.chat_log import HISTORY_PAGE, ReplyView
from localchat.tui.live_blocks import LiveParagraph, opens_nothing
from localchat.tui.live_markdown import LiveMarkdown, top_level_starts
from localchat.tui.pacing import (
    CPU_BOUND,
    REMOTE,
    SPARE_CORE,
    FrameBudget,
    FramePacer,
    frame_budget,
    route_budget,
)

TOKEN_DELAY_S = 0.001  # 5,000 tokens in ~6 s: frames of a few dozen tokens each


def one_paragraph(tokens: int) -> str:
    """The bench's one-paragraph reply, ``tokens`` of the scripted engine's tokens long."""
    return _sized(bench_shapes.one_paragraph, tokens)


def many_blocks(tokens: int) -> str:
    """The bench's many-block reply (headings, prose, code, lists, tables), ``tokens`` long."""
    return _sized(bench_shapes.many_blocks, tokens)


def _sized(shape, tokens: int) -> str:
    # The bench counts token-sized pieces; the scripted engine here streams a word a token.
    text, size = shape(tokens), tokens
    while len(split_tokens(text)) < tokens:
        size += tokens // 4
        text = shape(size)
    return text


class RecordingPacer(FramePacer):
    """The app's pacer, noting each frame: the interval it set and when it lets the next come."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, float, float]] = []

    def start(self) -> None:
        # Until the first token the app starts the pacer afresh at each frame (the first token
        # is never held back): the frames that count are the stream's, from the last start.
        super().start()
        self.frames.clear()

    def frame(self) -> None:
        at = time.perf_counter()
        super().frame()
        self.frames.append((at, self.interval, self._next_frame_at))


def laid_out(widget: Widget) -> int:
    """Widgets Textual arranges for ``widget``: itself and its displayed descendants."""
    return 1 + sum(laid_out(child) for child in widget.children if child.display)


def mounted(widget: Widget) -> int:
    """``widget`` and all its descendants, displayed or not."""
    return 1 + sum(mounted(child) for child in widget.children)


async def stream(store, script: str, size=(100, 30)):
    """Stream ``script`` through the app, noting per frame: (reply chars shown, widgets laid
    out in the log, widgets mounted in it). Returns the app's pacer, the reply's text, the
    body's work counters, that record and what the end looked like (``end``)."""
    app = make_app(store, FakeEngine(reply=script, token_delay=TOKEN_DELAY_S))
    record: list[tuple[int, int, int]] = []
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        pacer = RecordingPacer()
        app.turns.pacer = pacer
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.chat_log.last_reply() is not None, "the reply")
        reply = app.chat_log.last_reply()
        seen = 0
        while app.turns.current is not None:
            if len(pacer.frames) > seen:
                seen = len(pacer.frames)
                log = app.chat_log
                record.append((len(reply.text), laid_out(log), mounted(log)))
            await pilot.pause(0.005)
        await reply_finished(pilot)
        await pilot.pause()
        paragraphs = reply.body.query(LiveParagraph)
        end = {"laid_out": laid_out(reply.body), "painted": painted(app, reply.body),
               "paragraph_rows": paragraphs.first().size.height if paragraphs else 0}
        return pacer, reply.text, reply.body.work, record, end


async def test_a_5000_token_reply_shows_frames_at_the_pacers_interval_each_with_new_text(store):
    script = one_paragraph(5000)
    pacer, text, _, record, _ = await stream(store, script)
    assert text == script
    budget = pacer.budget
    frames = pacer.frames
    # How many depends on the machine's load (the pacer stretches frames up to its 0.5 s cap);
    # even at the cap a ~6 s reply has a dozen.
    assert len(frames) >= 10
    for (_, interval, due), (next_at, _, _) in zip(frames, frames[1:]):
        assert budget.min_frame_s <= interval <= budget.max_frame_s
        assert next_at >= due - 0.002  # no frame before the pacer lets it come
    shown = [chars for chars, _, _ in record]
    assert all(b > a for a, b in zip(shown, shown[1:]))  # every frame brought new text


async def test_a_long_paragraphs_frames_parse_and_render_only_its_tail(store):
    script = one_paragraph(5000)  # ~29,000 characters, ~290 lines at 100 columns
    _, _, work, record, end = await stream(store, script)
    # Each frame parses the paragraph's last line or two with the text that came, and renders
    # a few lines, however long the paragraph has grown; complete lines are rendered once.
    frames = work.per_frame[3:]  # the first ones wait for the first layout
    assert len(frames) >= 7  # a dozen frames at the pacer's 0.5 s cap, a busy machine's
    assert all(parsed <= 3 * fed + 1_000 and lines <= 10 + fed // 50 for fed, parsed, lines in frames)
    assert work.frozen_lines >= end["paragraph_rows"] - 2 > 200
    laid = [count for _, count, _ in record]
    assert max(laid[len(laid) // 2:]) <= max(laid[:len(laid) // 2]) + 2


async def test_a_many_block_reply_builds_each_block_once_and_lays_out_only_what_is_near_the_screen(store):
    script = many_blocks(5000)
    _, text, work, record, end = await stream(store, script)
    assert text == script
    blocks = top_level_starts(MarkdownIt("gfm-like").parse(script))
    assert work.blocks_built <= len(blocks) + 1  # each finished block built once (+ the last)
    # A frame parses the open block (a list, a table, a code block: a few hundred characters).
    assert all(parsed <= 4 * fed + 2_000 for fed, parsed, _ in work.per_frame[3:])
    # What scrolled away is folded: a frame lays out what is on screen and what it added. Less
    # what it added (on a busy machine a stretched frame adds a hundred widgets or more), that
    # is a small part of the reply, which is all laid out again when it ends.
    total = end["laid_out"]
    assert total > 1_200
    near_screen = [laid - (now - before) for (_, _, before), (_, laid, now) in zip(record, record[1:])]
    assert max(near_screen) < total // 5


class OneShot(App):
    """A reply rendered at once, as a stored turn is (``Markdown.update``)."""

    CSS = "VerticalScroll { height: 1fr; } LiveMarkdown { margin: 0; padding: 0; }"

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self):
        with VerticalScroll():
            yield LiveMarkdown(self.text)


class Streamed(OneShot):
    """The same body fed the reply a few tokens at a time, with a screen update between."""

    def __init__(self, text: str) -> None:
        super().__init__("")
        self.script = text

    async def stream(self, pilot) -> None:
        body = self.query_one(LiveMarkdown)
        tokens = split_tokens(self.script)
        for start in range(0, len(tokens), 13):
            await body.feed("".join(tokens[start:start + 13]))
            await pilot.pause()
        await body.finish(self.script)
        await pilot.pause()


def painted(app: App, widget: Widget) -> list[list[tuple[str, str]]]:
    """The rows of the screen that ``widget`` covers (those on screen), as (text, style) segments."""
    strips = app.screen._compositor.render_strips()
    region = widget.region
    return [[(s.text, str(s.style)) for s in strips[y].crop(region.x, region.right)]
            for y in range(max(0, region.y), min(len(strips), region.bottom))]


@pytest.mark.parametrize("shape", [one_paragraph, many_blocks])
async def test_the_final_screen_equals_a_one_shot_render_of_the_same_markdown(shape):
    script = shape(1200)
    streamed, oneshot = Streamed(script), OneShot(script)
    async with streamed.run_test(size=(90, 500)) as pilot:
        await streamed.stream(pilot)
        got = painted(streamed, streamed.query_one(LiveMarkdown))
    async with oneshot.run_test(size=(90, 500)) as pilot:
        await pilot.pause()
        want = painted(oneshot, oneshot.query_one(LiveMarkdown))
    assert len(got) > 50 and got == want


async def test_while_a_paragraph_streams_it_looks_as_a_one_shot_render_of_the_text_so_far():
    # Emphasis, a code span and a link that each open on one line and close lines later: the
    # lines above a closer must not be frozen before it comes.
    script = ("Some words come first " * 6 + "then **bold text that runs " + "on and " * 12 + "ends** here, "
              + "a `code span " + "still " * 14 + "code` and a [link whose text " + "goes " * 16
              + "on](https://example.org) " + "and plain words after it " * 8).strip()
    tokens = split_tokens(script)
    for upto in (40, 75, 110, len(tokens)):
        prefix = "".join(tokens[:upto])
        streamed, oneshot = Streamed(prefix), OneShot(prefix)
        async with streamed.run_test(size=(60, 60)) as pilot:
            body = streamed.query_one(LiveMarkdown)
            for start in range(0, upto, 3):
                await body.feed("".join(tokens[start:min(start + 3, upto)]))
                await pilot.pause()
            got = painted(streamed, body)
            assert streamed.query_one(LiveParagraph).frozen_lines > 0
        async with oneshot.run_test(size=(60, 60)) as pilot:
            await pilot.pause()
            want = painted(oneshot, oneshot.query_one(LiveMarkdown))
        assert got[: len(want)] == want, f"after {upto} tokens"


async def test_a_reply_streamed_in_the_app_ends_drawn_as_its_stored_turn_is(store):
    script = many_blocks(400)
    _, _, _, _, end = await stream(store, script, size=(100, 300))
    async with make_app(store, FakeEngine(), continue_last=True).run_test(size=(100, 300)) as pilot:
        await ready(pilot)
        await pilot.pause()
        stored = pilot.app.chat_log.last_reply()
        assert isinstance(stored, ReplyView) and stored.text == script
        assert stored.body.region.y >= 0 and len(end["painted"]) == stored.body.region.height > 50
        assert painted(pilot.app, stored.body) == end["painted"]


def test_a_head_is_cut_only_where_nothing_in_it_waits_for_a_closer():
    parser = MarkdownIt("gfm-like")

    def render(source: str):
        from textual.widgets._markdown import MarkdownBlock

        tokens = parser.parseInline(source) if source else []
        return MarkdownBlock._token_to_content(None, tokens[0]) if tokens else ""  # type: ignore[arg-type]

    assert opens_nothing("1, 2, 3, 4, ", render)
    assert opens_nothing("some **bold** and `code` done ", render)
    assert not opens_nothing("some **bold that goes on ", render)
    assert not opens_nothing("see `the code ", render)
    assert not opens_nothing("a [link that is still open ", render)
    assert not opens_nothing("strike ~~this ", render)


def test_the_ui_may_spend_more_when_llama_cpp_leaves_a_core_free_or_runs_on_a_gpu():
    assert frame_budget(0, cpus=2) is CPU_BOUND  # one thread per core: decode needs them all
    assert frame_budget(2, cpus=2) is CPU_BOUND
    assert frame_budget(1, cpus=2) is SPARE_CORE
    assert frame_budget(0, cpus=8, gpu_layers=30, n_layers=30, backend="CUDA") is SPARE_CORE
    assert frame_budget(0, cpus=8, gpu_layers=10, n_layers=30, backend="CUDA") is CPU_BOUND
    assert SPARE_CORE.share > CPU_BOUND.share and SPARE_CORE.min_frame_s < CPU_BOUND.min_frame_s
    # The remote model's text: nothing local decodes, whatever the engine.
    assert route_budget(None, "remote") is REMOTE and route_budget(None, "auto") is CPU_BOUND
    assert REMOTE.share > SPARE_CORE.share and REMOTE.slack_rows == 0


def test_frames_follow_their_smoothed_cost_within_the_budgets_bounds():
    now, cpu = [0.0], [0.0]
    budget = FrameBudget("test", share=0.1, min_frame_s=0.05, max_frame_s=0.15)
    pacer = FramePacer(budget, clock=lambda: now[0], cpu_clock=lambda: cpu[0])
    pacer.start()
    pacer.frame()
    for spent in (0.060, 0.030, 0.006):  # the first two frames lay new things out: not the pace
        cpu[0] += spent
        pacer.frame()
    assert pacer.wait() == pytest.approx(0.06)  # the median of the frames after them
    for _ in range(30):
        cpu[0] += 0.006
        pacer.frame()
    assert pacer.wait() == pytest.approx(0.06)
    cpu[0] += 0.030  # one frame that resized the reply: the next waits a little longer, not 300 ms
    pacer.frame()
    assert pacer.wait() == pytest.approx(0.072)  # its cost is spread over the frames that follow
    for _ in range(30):  # cheap frames again: back to their own pace
        cpu[0] += 0.006
        pacer.frame()
    assert pacer.wait() == pytest.approx(0.06, abs=0.005)


async def test_text_folded_away_while_streaming_comes_back_when_the_user_scrolls_up(store):
    async with held_mid_reply(store, many_blocks(1500), 1200, token_delay=TOKEN_DELAY_S) as pilot:
        app = pilot.app
        await pilot.pause(0.3)
        body = app.chat_log.last_reply().body
        hidden = [w for w in body.children if not w.display]
        assert hidden  # what scrolled away is folded
        kept = next(w for w in body.children if w.display and w.__class__.__name__ != "Spacer")
        y_before = kept.virtual_region.y
        await pilot.press("pageup")
        await pilot.pause()
        assert all(w.display for w in body.children)
        assert kept.virtual_region.y == y_before  # nothing moved when it came back


async def test_a_long_conversation_stays_folded_above_the_view_between_replies(store):
    # A mount lays out every displayed widget: with 50 stored turns shown, sending a prompt cost
    # ~250 ms of layout before its first token could show, and the end of each reply as much.
    bench_shapes.store_conversation(store, 30, "fake-model")
    app = make_app(store, FakeEngine(reply="A short answer."), continue_last=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        log = app.chat_log
        await wait_until(pilot, lambda: not log.messages()[0].display, "the history to fold")
        await send(pilot, "one more")
        await reply_finished(pilot)
        await pilot.pause()
        hidden = [m for m in log.messages() if not m.display]
        # Of the 22 shown (the last stored page and the new exchange), the reply's end showed
        # none of the folded ones again.
        assert len(log.messages()) == HISTORY_PAGE + 2 and len(hidden) > 15
        assert len(app.screen._compositor.full_map) < len(list(log.walk_children())) / 3
        folded = screen_lines(app)
        log.unfold()
        await pilot.pause()
        assert screen_lines(app) == folded  # folding changed nothing on screen
        await log.fold_history()
        await pilot.pause()
        assert screen_lines(app) == folded
        await pilot.press("ctrl+t")  # reasoning blocks open: hidden heights would change
        assert all(m.display for m in log.messages())
        await pilot.pause()
        await log.fold_history()
        assert not log.messages()[0].display
        await pilot.press("pageup")
        await pilot.pause()
        assert all(m.display for m in log.messages())  # scrolled up: the real text is there


async def test_a_frame_that_grows_a_paragraph_is_laid_out_once(monkeypatch):
    # A widget whose virtual size changed used to ask Textual for a second layout of a frame
    # (``tui/laid_out_once``); each frame here feeds a few words and lets the screen update.
    layouts = [0]
    refresh_layout = Screen._refresh_layout

    def counted(self, size=None, scroll=False):
        layouts[0] += not scroll
        refresh_layout(self, size, scroll)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    app = Streamed(one_paragraph(600))
    async with app.run_test(size=(90, 30)) as pilot:
        await pilot.pause()
        body = app.query_one(LiveMarkdown)
        tokens = split_tokens(app.script)
        layouts[0], grew, height = 0, 0, 0
        for start in range(0, len(tokens), 13):
            await body.feed("".join(tokens[start:start + 13]))
            await pilot.pause()
            rows = body.query_one(LiveParagraph).size.height
            grew, height = grew + (rows != height), rows
    assert grew > 20
    assert layouts[0] <= 1.2 * grew + 2  # (the scrollbar's coming is one more; twice as many before)


async def test_the_prompts_cursor_holds_still_while_a_reply_streams(store):
    # A blink repaints the prompt's line: UI time the pacer would take from the reply's frames.
    app = make_app(store, FakeEngine(reply=one_paragraph(400), token_delay=TOKEN_DELAY_S, hold_after=100))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert app.prompt.cursor_blink
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.turns.current is not None
                         and app.turns.current.meter.tokens >= 100, "the reply to stream")
        assert not app.prompt.cursor_blink
        await pilot.press("escape")
        await reply_finished(pilot)
        assert app.prompt.cursor_blink


async def test_repainting_the_reply_s_line_renders_none_of_the_widgets_below_the_log(store, monkeypatch):
    # Textual renders every widget whose clip overlaps a repaint: the prompt, status bar and
    # footer sit in containers of their own so that a frame's one-line repaint skips them.
    async with held_mid_reply(store, one_paragraph(400), 150, token_delay=TOKEN_DELAY_S) as pilot:
        app = pilot.app
        await pilot.pause(0.6)  # the last paced frame
        rendered: list[str] = []
        render_lines = Widget.render_lines

        def noted(self, crop):
            rendered.append(type(self).__name__)
            return render_lines(self, crop)

        monkeypatch.setattr(Widget, "render_lines", noted)
        paragraph = app.chat_log.last_reply().body.query_one(LiveParagraph)
        paragraph.refresh(Region(0, paragraph.size.height - 1, paragraph.size.width, 1))
        await pilot.pause()
        monkeypatch.undo()
        assert "LiveParagraph" in rendered
        assert not {"PromptInput", "StatusBar", "Footer", "CommandHints"} & set(rendered)
