"""What the app costs and how steady it looks: decode speed through the running app versus the
engine alone, how fast a keypress is handled while a reply streams, and the reply's frames.

``measure_streaming_overhead`` loads the model once and alternates runs of the same greedy turn
(so both produce the same tokens): the engine read directly by a plain loop, then the app driven
headless (``App.run_test``: layout, Markdown streaming and compositing all run; only the final
write to a terminal is skipped). Alternating cancels most of the drift of a shared machine.
During each app run it types keys into the prompt and times each from the key event being posted
to the prompt having changed, which is what the user waits for, and logs the frames
(``frame_log``). The same is done once more with llama.cpp on one thread (a core left free, as
when the model runs on a GPU), and for two replies of ~2,200 tokens the test model would not
write, one long paragraph and many Markdown blocks (code, a list, a table), streamed by a
scripted engine at 80 tokens/s (``scripted_engine``), and for a 600-token paragraph sent below 50
stored exchanges (a reopened long conversation).

``localchat bench --tui`` prints this (``--pty``: the app on a pseudo-terminal, ``bench.pty_app``);
run it directly with ``python -m localchat.bench.app MODEL.gguf [N_TOKENS]``.
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

from textual import events

from localchat.bench.frame_log import FrameLog
from localchat.bench.script import run_turn
from localchat.bench.scripted_engine import (
    ScriptedEngine,
    many_blocks,
    one_paragraph,
    store_conversation,
)
from localchat.bench.targets import tui_targets
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.engine.turn import TurnHandle
from localchat.events import Event, Loaded, Token
from localchat.percentiles import percentile
from localchat.store import Store
from localchat.tui.app import LocalChatApp
from localchat.tui.prompt import PromptInput

# Greedy SmolLM2-135M keeps counting to the token limit, so every run yields n_tokens tokens.
DEFAULT_PROMPT = "Write all the numbers from 1 to 1000, separated by commas. Do not stop early."
KEYPRESS_INTERVAL_S = 0.25
SHAPE_TOKENS = 2200  # long enough for the "late" frames (~2,000 tokens in)
SHAPE_TPOT_S = 0.0125  # 80 tokens/s: the test model on this kind of machine
ONE_THREAD_TOKENS = 400
# A reply below a long conversation: the first frames lay out whatever of it is displayed.
HISTORY_TURNS = 50
HISTORY_SHAPE_TOKENS = 600
HISTORY_READ_S = 2.0  # the user reads the reopened session before sending


class LentEngine:
    """The bench's engine, lent to an app run: the app's ``close`` on exit must not unload it.
    Every other attribute is the engine's, so ``lend`` hands it to the app as the engine.
    ``on_token`` is called as the engine emits each token (for the display lag)."""

    def __init__(self, engine: Engine, on_token: Callable[[], None] | None = None) -> None:
        self._engine = engine
        self._on_token = on_token

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

    def submit(self, messages: list[dict[str, str]], sampling: Sampling | None = None) -> TurnHandle:
        handle = self._engine.submit(messages, sampling)
        if self._on_token is not None:
            emit, note = handle.emit, self._on_token

            def timed(event: Event) -> None:
                if isinstance(event, Token):
                    note()
                emit(event)

            handle.emit = timed  # type: ignore[method-assign]
        return handle

    def close(self) -> None:
        """The bench closes the engine itself, after the last run."""


def lend(engine: Engine, on_token: Callable[[], None] | None = None) -> Engine:
    """``engine`` for an app run that must not close it (see ``LentEngine``)."""
    return cast(Engine, LentEngine(engine, on_token))


class _TimedApp(LocalChatApp):
    """The app, noting when the prompt changed (to time keypresses) and when it painted."""

    # Textual looks for a relative CSS_PATH beside the module that defines the app's class.
    CSS_PATH = str(Path(inspect.getfile(LocalChatApp)).with_name("app.tcss"))

    def __init__(self, frame_log: FrameLog, **options: Any) -> None:
        super().__init__(**options)
        self.prompt_changed_at: list[float] = []
        self.frame_log = frame_log
        frame_log.watch(self)

    def on_text_area_changed(self, event: PromptInput.Changed) -> None:
        self.prompt_changed_at.append(time.perf_counter())
        super().on_text_area_changed(event)

    def _display(self, screen: Any, renderable: Any) -> None:
        if renderable is not None:
            self.frame_log.paint()
        super()._display(screen, renderable)


async def _through_app(engine: Any, prompt: str, sampling: Sampling, store: Store, frame_log: FrameLog,
                       *, keys: bool = True, continue_last: bool = False, read_s: float = 0.0) -> dict[str, Any]:
    """One turn through the app (in a new session, or ``continue_last``: the last one, sent
    ``read_s`` after it opened, as when the user reads before typing)."""
    app = _TimedApp(frame_log, store=store, engine_factory=lambda ref: engine,
                    sampling_factory=lambda: sampling, list_models=list, continue_last=continue_last)
    latencies: list[float] = []
    async with app.run_test(size=(100, 40)) as pilot:
        while app.models.engine is None:
            await pilot.pause(0.05)
        await asyncio.sleep(read_s)
        shown = app.chat_log.last_reply()  # a stored one, when continuing
        app.prompt.text = prompt
        # Enter as a terminal sends it: ``pilot.press`` also waits on a callback posted to every
        # widget, ~80 ms of UI time below a long conversation that no user's key costs.
        app.post_message(events.Key("enter", "\r"))
        while app.chat_log.last_reply() is shown:  # the turn started (it may end at once)
            await pilot.pause(0.01)
        while app.turns.current is not None:
            await asyncio.sleep(KEYPRESS_INTERVAL_S)
            if not keys or app.turns.current is None or app.turns.current.meter.first_token_at is None:
                continue  # only keypresses during streaming count
            seen = len(app.prompt_changed_at)
            pressed_at = time.perf_counter()
            await pilot.press("x")
            if len(app.prompt_changed_at) > seen:
                latencies.append((app.prompt_changed_at[seen] - pressed_at) * 1000)
        reply = app.chat_log.last_reply()
        assert reply is not None  # waited for above
        while not reply.finished:
            await pilot.pause(0.01)
        if reply.has_class("-failed"):
            raise RuntimeError(f"the bench's turn failed in the app: {reply.query_one('.caption').render()}")
    session = store.last_session()
    assert session is not None  # the turn was stored
    turn = store.turns(session.id)[-1]
    return {"timings": turn.timings, "keypress_ms": latencies}


async def _alternate(engine: Engine, prompt: str, sampling: Sampling, store: Store,
                     rounds: int) -> dict[str, Any]:
    """``rounds`` × (the engine alone, then the app); the frames of each app run."""
    alone, in_app, keypress_ms, frames = [], [], [], []
    for _ in range(rounds):
        handle = engine.submit([{"role": "user", "content": prompt}], sampling)
        alone.append((await asyncio.to_thread(run_turn, handle))[0].timings)
        log = FrameLog()
        run = await _through_app(lend(engine, log.token), prompt, sampling, store, log)
        in_app.append(run["timings"])
        keypress_ms += run["keypress_ms"]
        frames.append(log.summary())
    return {**_speeds(alone, in_app, keypress_ms), "frames": _median_summary(frames)}


async def _shape(text: str, store: Store, tpot_s: float = SHAPE_TPOT_S, *, below_turns: int = 0,
                 route: str = "local") -> dict[str, Any]:
    """The frames of ``text`` streamed through the app by the scripted engine, in a new session
    or below ``below_turns`` stored exchanges (``store_conversation``); with ``route`` "remote"
    the reply is handed over before its first token, as an escalated one is."""
    log = FrameLog()
    engine = ScriptedEngine(text, tpot_s, on_token=lambda _index: log.token(), route=route)
    if below_turns:
        store_conversation(store, below_turns, engine.name)
    await _through_app(engine, "go", Sampling(), store, log, keys=False, continue_last=below_turns > 0,
                       read_s=HISTORY_READ_S if below_turns else 0.0)
    return log.summary()


async def measure_streaming_overhead_async(
    model_path: Path, n_tokens: int = 1000, *, rounds: int = 2, prompt: str = DEFAULT_PROMPT, n_ctx: int = 2048,
    shapes: bool = True, one_thread: bool = True,
) -> dict[str, Any]:
    """See ``measure_streaming_overhead``; for callers already inside an event loop."""
    sampling = Sampling(temperature=0.0, max_tokens=n_tokens, seed=0)
    with tempfile.TemporaryDirectory() as scratch, Store.open(Path(scratch) / "bench.db") as store:
        engine = Engine(Path(model_path), EngineOptions(n_ctx=n_ctx))
        engine.load()
        try:
            report = await _alternate(engine, prompt, sampling, store, rounds)
        finally:
            engine.close()
        if one_thread:
            engine = Engine(Path(model_path), EngineOptions(n_ctx=n_ctx, n_threads=1))
            engine.load()
            try:
                short = Sampling(temperature=0.0, max_tokens=min(n_tokens, ONE_THREAD_TOKENS), seed=0)
                one = await _alternate(engine, prompt, short, store, 1)
            finally:
                engine.close()
            report["one_thread"] = {k: v for k, v in one.items() if not k.startswith("keypress")}
        if shapes:
            report["shapes"] = {
                "one_paragraph": await _shape(one_paragraph(SHAPE_TOKENS), store),
                "many_blocks": await _shape(many_blocks(SHAPE_TOKENS), store),
                "many_blocks_from_the_remote": await _shape(many_blocks(SHAPE_TOKENS), store, route="remote"),
                f"one_paragraph_below_{HISTORY_TURNS}_turns": await _shape(
                    one_paragraph(HISTORY_SHAPE_TOKENS), store, below_turns=HISTORY_TURNS),
            }
    report["targets"] = tui_targets(report)
    return report


def _speeds(alone: list, in_app: list, keypress_ms: list[float]) -> dict[str, Any]:
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


def _median_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each field's median over the runs (the larger middle one of two)."""
    merged: dict[str, Any] = {}
    for key in summaries[0]:
        values = sorted(v for s in summaries if (v := s.get(key)) is not None)
        merged[key] = values[len(values) // 2] if values else None
    return merged


def measure_streaming_overhead(model_path: Path, n_tokens: int = 1000, **options: Any) -> dict[str, Any]:
    """Decode tokens/s of one greedy ``n_tokens`` reply through the headless app versus the engine
    alone (means over ``rounds`` alternating runs), the overhead in percent, the time to handle
    keypresses typed while the reply streams, and the frames of those replies; the same with
    llama.cpp on one thread; the frames of two scripted ~2,200-token replies. Targets at the end.

    Loads the model itself (n_ctx 2048, CPU or GPU as the engine decides); takes roughly
    ``2 × rounds`` times one reply's generation time, plus ~90 s.
    """
    return asyncio.run(measure_streaming_overhead_async(model_path, n_tokens, **options))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m localchat.bench.app MODEL.gguf [N_TOKENS]")
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(json.dumps(measure_streaming_overhead(Path(sys.argv[1]), tokens), indent=2))
