"""First run with no model: the app offers the download (size, progress bar, Cancel) instead of
sending the user off to `localchat pull`."""

from __future__ import annotations

import threading
import time

from fake_engine import SIZE, FakeEngine, make_app, notices, wait_until

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


def test_only_known_models_that_are_not_on_disk_are_offered(tmp_path):
    offer = RegistryDownloads().offer(None)  # the default model, in an empty home
    assert offer is not None and offer.model == "smollm2-135m"
    assert RegistryDownloads().offer(str(tmp_path / "x.gguf")) is None  # a path: nothing to pull
    assert RegistryDownloads().offer("no-such-model") is None
