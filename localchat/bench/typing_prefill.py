"""What prefill while typing buys: the TTFT of a long pasted message sent ``delay_s`` after the
paste, against a short message's TTFT and against the same paste with prefill while typing off.

Runs the headless app (``App.run_test``) over one loaded model. Each round opens a session,
has one short exchange (so every measured turn continues a conversation, as in real use), then:
a ~20-token message sent at once; a ~1,000-token paste sent ``delay_s`` later; the same paste
sent ``delay_s`` later in a session whose draft prefill is switched off. TTFT is measured on
screen, from the Enter key to the first token shown (so a wait for a draft step counts).
``localchat bench --typing [DELAY_S]`` prints it; run it directly with
``python -m localchat.bench.typing_prefill MODEL.gguf [DELAY_S]``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from localchat.bench.app import lend
from localchat.bench.targets import typing_targets
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.store import Store
from localchat.tui.app import LocalChatApp

SHORT = "What is the capital of France? Answer with one word, then stop."  # ~20 tokens
_COLOURS = ("red", "green", "blue", "amber")
PASTE = " ".join(f"Row {i}: the {_COLOURS[i % 4]} crate in aisle {i % 9} holds {i * 7} bolts."
                 for i in range(50)) + "\nWhich aisle holds the most bolts?"  # ~1,000 tokens


async def _turn_ttft(app: LocalChatApp, pilot: Any, store: Store, text: str, delay_s: float) -> dict[str, Any]:
    app.prompt.text = text  # one change event, as a paste makes
    await asyncio.sleep(delay_s)
    steps = app.conversation.chat.draft.steps if app.conversation and app.conversation.chat else 0
    await pilot.press("enter")
    while app.turns.current is None or app.turns.current.reply is None:  # the turn starts before its reply is shown
        await asyncio.sleep(0.01)
    turn, reply = app.turns.current, app.turns.current.reply
    while app.turns.current is not None or not reply.finished:  # finished on screen, not only stored
        await asyncio.sleep(0.02)
    timings = store.turns(store.last_session().id)[-1].timings
    meter = turn.meter  # on screen: from the Enter key to the first token shown
    return {"ttft_ms": round((meter.first_token_at - meter.submitted_at) * 1000, 1),
            "engine_ttft_ms": round(timings.ttft_ms, 1), "prompt_n": timings.prompt_n,
            "cache_n": timings.cache_n, "draft_steps": steps}


async def _round(engine: Engine, store: Store, sampling: Sampling, delay_s: float, prefill: bool) -> dict[str, Any]:
    app = LocalChatApp(store=store, engine_factory=lambda ref: lend(engine),
                       sampling_factory=lambda: sampling, list_models=list)
    async with app.run_test(size=(100, 40)) as pilot:
        while app.models.engine is None:
            await asyncio.sleep(0.05)
        await _turn_ttft(app, pilot, store, "Hello! I will ask you about some crates.", 0.0)
        if not prefill:
            app.draft.schedule = lambda text: None  # type: ignore[method-assign]
        short = await _turn_ttft(app, pilot, store, SHORT, 0.0)
        paste = await _turn_ttft(app, pilot, store, PASTE, delay_s)
    return {"short": short, "paste": paste}


async def measure_typing_prefill_async(model_path: Path, delay_s: float = 1.0, rounds: int = 2,
                                       n_ctx: int = 4096) -> dict[str, Any]:
    engine = Engine(Path(model_path), EngineOptions(n_ctx=n_ctx))
    engine.load()
    sampling = Sampling(temperature=0.0, max_tokens=8, seed=0)
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    paste_tokens = engine.count_tokens(PASTE)
    try:
        with tempfile.TemporaryDirectory() as scratch, Store.open(Path(scratch) / "bench.db") as store:
            for _ in range(rounds):
                for mode in ("on", "off"):  # alternating cancels most of a shared machine's drift
                    engine.reset()
                    runs[mode].append(await _round(engine, store, sampling, delay_s, mode == "on"))
    finally:
        engine.close()
    # The 20-token message as it costs with nothing prefilled before Enter.
    short = statistics.median(r["short"]["ttft_ms"] for r in runs["off"])
    paste = statistics.median(r["paste"]["ttft_ms"] for r in runs["on"])
    paste_off = statistics.median(r["paste"]["ttft_ms"] for r in runs["off"])
    return {
        "delay_s": delay_s,
        "paste_tokens": paste_tokens,
        "short_ttft_ms": short,
        "paste_ttft_ms": paste,
        "paste_ttft_without_prefill_ms": paste_off,
        "paste_over_short": round(paste / short, 2) if short else None,
        "runs": runs,
        "targets": typing_targets(delay_s, paste, short),
    }


def measure_typing_prefill(model_path: Path, delay_s: float = 1.0, **options: Any) -> dict[str, Any]:
    """See the module docstring. Takes a few times one long prefill."""
    return asyncio.run(measure_typing_prefill_async(model_path, delay_s, **options))


if __name__ == "__main__":
    import json
    import sys

    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    print(json.dumps(measure_typing_prefill(Path(sys.argv[1]), delay), indent=1))

