"""What the app costs: decode speed through the running app versus the engine alone, and how fast
a keypress is handled while a reply streams.

``measure_streaming_overhead`` loads the model once and alternates runs of the same greedy turn
(so both produce the same tokens): the engine read directly by a plain loop, then the app driven
headless (``App.run_test``: layout, Markdown streaming and compositing all run; only the final
write to a terminal is skipped). Alternating cancels most of the drift of a shared machine.
During each app run it types keys into the prompt and times each from the key event being posted
to the prompt having changed, which is what the user waits for.

``localchat bench --tui`` prints this; run it directly with
``python -m localchat.bench.app MODEL.gguf [N_TOKENS]``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from localchat.bench.script import run_turn
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Loaded
from localchat.percentiles import percentile
from localchat.store import Store
from localchat.tui.app import LocalChatApp
from localchat.tui.prompt import PromptInput

# Greedy SmolLM2-135M keeps counting to the token limit, so every run yields n_tokens tokens.
DEFAULT_PROMPT = "Write all the numbers from 1 to 1000, separated by commas. Do not stop early."
KEYPRESS_INTERVAL_S = 0.25


class LentEngine:
    """The bench's engine, lent to an app run: the app's ``close`` on exit must not unload it.
    Every other attribute is the engine's, so ``lend`` hands it to the app as the engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def load(self, on_progress: Callable[[float], None] | None = None) -> Loaded:
        """Loaded already, by the bench: a second load would read the model again (and leave
        the first copy in memory) for every app run."""
        info = self._engine.info
        if info is None:
            return self._engine.load(on_progress)
        if on_progress:
            on_progress(1.0)
        return info

    def close(self) -> None:
        """The bench closes the engine itself, after the last run."""


def lend(engine: Engine) -> Engine:
    """``engine`` for an app run that must not close it (see ``LentEngine``)."""
    return cast(Engine, LentEngine(engine))


class _TimedApp(LocalChatApp):
    """The app, noting when the prompt changed (to time keypresses)."""

    # Textual looks for a relative CSS_PATH beside the module that defines the app's class.
    CSS_PATH = str(Path(inspect.getfile(LocalChatApp)).with_name("app.tcss"))

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.prompt_changed_at: list[float] = []

    def on_text_area_changed(self, event: PromptInput.Changed) -> None:
        self.prompt_changed_at.append(time.perf_counter())
        super().on_text_area_changed(event)


async def _through_app(engine: Engine, prompt: str, sampling: Sampling, store: Store) -> dict[str, Any]:
    app = _TimedApp(store=store, engine_factory=lambda ref: lend(engine),
                    sampling_factory=lambda: sampling, list_models=list)
    latencies: list[float] = []
    async with app.run_test(size=(100, 40)) as pilot:
        while app.models.engine is None:
            await pilot.pause(0.05)
        app.prompt.text = prompt
        await pilot.press("enter")
        while app.turns.current is None:
            await pilot.pause(0.01)
        while app.turns.current is not None:
            await asyncio.sleep(KEYPRESS_INTERVAL_S)
            if app.turns.current is None or app.turns.current.meter.first_token_at is None:
                continue  # only keypresses during streaming count
            seen = len(app.prompt_changed_at)
            pressed_at = time.perf_counter()
            await pilot.press("x")
            if len(app.prompt_changed_at) > seen:
                latencies.append((app.prompt_changed_at[seen] - pressed_at) * 1000)
        reply = app.chat_log.last_reply()
        while not reply.finished:
            await pilot.pause(0.01)
    turn = store.turns(store.last_session().id)[-1]
    return {"timings": turn.timings, "keypress_ms": latencies}


async def measure_streaming_overhead_async(
    model_path: Path, n_tokens: int = 1000, *, rounds: int = 2, prompt: str = DEFAULT_PROMPT, n_ctx: int = 2048
) -> dict[str, Any]:
    """See ``measure_streaming_overhead``; for callers already inside an event loop."""
    engine = Engine(Path(model_path), EngineOptions(n_ctx=n_ctx))
    engine.load()
    sampling = Sampling(temperature=0.0, max_tokens=n_tokens, seed=0)
    alone, in_app, keypress_ms = [], [], []
    try:
        with tempfile.TemporaryDirectory() as scratch, Store.open(Path(scratch) / "bench.db") as store:
            for _ in range(rounds):
                handle = engine.submit([{"role": "user", "content": prompt}], sampling)
                alone.append((await asyncio.to_thread(run_turn, handle))[0].timings)
                run = await _through_app(engine, prompt, sampling, store)
                in_app.append(run["timings"])
                keypress_ms += run["keypress_ms"]
    finally:
        engine.close()
    return _report(alone, in_app, keypress_ms)


def _report(alone: list, in_app: list, keypress_ms: list[float]) -> dict[str, Any]:
    alone_tps = statistics.mean(t.predicted_per_second for t in alone)
    app_tps = statistics.mean(t.predicted_per_second for t in in_app)
    ordered = sorted(keypress_ms)
    return {
        "tokens": [t.predicted_n for t in alone + in_app],
        "engine_alone_tokens_per_s": round(alone_tps, 2),
        "in_app_tokens_per_s": round(app_tps, 2),
        "overhead_percent": round(100 * (1 - app_tps / alone_tps), 1) if alone_tps else None,
        "engine_alone_tpot_ms": round(statistics.mean(t.tpot_ms for t in alone), 2),
        "in_app_tpot_ms": round(statistics.mean(t.tpot_ms for t in in_app), 2),
        "keypresses": len(ordered),
        "keypress_p50_ms": round(statistics.median(ordered), 1) if ordered else None,
        "keypress_p95_ms": round(percentile(ordered, 95), 1) if ordered else None,
        "keypress_max_ms": round(ordered[-1], 1) if ordered else None,
    }


def measure_streaming_overhead(model_path: Path, n_tokens: int = 1000, **options: Any) -> dict[str, Any]:
    """Decode tokens/s of one greedy ``n_tokens`` reply through the headless app versus the engine
    alone (means over ``rounds`` alternating runs), the overhead in percent (target ≤ 10), and
    the time to handle keypresses typed while the reply streams (target ≤ 50 ms).

    Loads the model itself (n_ctx 2048, CPU or GPU as the engine decides); takes roughly
    ``2 × rounds`` times one reply's generation time.
    """
    return asyncio.run(measure_streaming_overhead_async(model_path, n_tokens, **options))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m localchat.bench.app MODEL.gguf [N_TOKENS]")
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(json.dumps(measure_streaming_overhead(Path(sys.argv[1]), tokens), indent=2))
