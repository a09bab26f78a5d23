"""Decode speed and stop latency: the engine's tokens against llama.cpp's own loop on the same
prompt, and how fast a stop takes effect while decoding and in the middle of a long prefill."""

from __future__ import annotations

import statistics
import threading
import time

from localchat.bench.script import DEFAULT_SYSTEM, run_turn
from localchat.context.chat_context import ChatContext
from localchat.engine.engine import Engine
from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.events import Done, PrefillProgress, Token

STORY_PROMPT = "Tell me a long story about a lighthouse keeper."


def decode_speed(engine: Engine, n_tokens: int = 128, rounds: int = 3) -> dict:
    """Engine decode speed against llama.cpp with no engine around it, measured alternately in
    the same window (a shared machine drifts): the raw loop is ``Llama.eval([token])`` + argmax
    over the last logits; the engine is a greedy turn on the same prompt. Medians of ``rounds``."""
    raw, engine_ms = [], []
    for _ in range(rounds):
        raw.append(engine.raw_decode_ms_per_token([{"role": "user", "content": STORY_PROMPT}], n_tokens))
        engine.reset()
        session = ChatContext(engine, sampling=Sampling(temperature=0, repeat_penalty=1.0,
                                                        max_tokens=n_tokens))
        done, _ = run_turn(session.send(STORY_PROMPT))
        engine_ms.append(done.timings.tpot_ms)
    engine.reset()
    raw_ms, eng_ms = statistics.median(raw), statistics.median(engine_ms)
    return {"raw_ms_per_token": round(raw_ms, 2), "engine_ms_per_token": round(eng_ms, 2),
            "engine_speed_ratio": round(raw_ms / eng_ms, 3) if eng_ms else 0.0}


def abort_while_decoding(engine: Engine, after_tokens: int = 16) -> dict:
    """Stop a reply after a few tokens; ms from stop() to the final Done event."""
    engine.reset()
    session = ChatContext(engine, system=DEFAULT_SYSTEM, sampling=Sampling(temperature=0, max_tokens=400))
    handle = session.send("Write a long story about a lighthouse keeper and a storm.")
    seen, stopped_at = 0, None
    for event in handle:
        if isinstance(event, Token):
            seen += 1
            if seen == after_tokens and stopped_at is None:
                stopped_at = time.perf_counter()
                handle.stop()
        elif isinstance(event, Done):
            latency = (time.perf_counter() - stopped_at) * 1000.0 if stopped_at else None
            engine.reset()
            return {"latency_ms": latency, "tokens_before_stop": after_tokens,
                    "tokens_total": event.timings.predicted_n, "tpot_ms": event.timings.tpot_ms,
                    "finish_reason": event.finish_reason}
    raise UserError("the abort test turn ended without Done")


def abort_during_prefill(engine: Engine, prompt_tokens: int = 3000, stop_after_s: float = 1.5) -> dict | None:
    """Stop in the middle of prefilling a long pasted document: a timer thread calls stop() at
    an arbitrary moment (mid-batch, not at a chunk boundary); ms from stop() to Done."""
    n_ctx = engine.n_ctx
    if n_ctx < prompt_tokens + 64:
        return None
    engine.reset()
    document = " ".join(f"word{i % 97}" for i in range(prompt_tokens))
    while engine.count_tokens(document) > prompt_tokens:
        document = document[: int(len(document) * 0.95)]
    session = ChatContext(engine, sampling=Sampling(temperature=0, max_tokens=8))
    handle = session.send(document)
    stopped_at: list[float] = []

    def stop() -> None:
        stopped_at.append(time.perf_counter())
        handle.stop()

    timer = threading.Timer(stop_after_s, stop)
    timer.start()
    progress = (0, 0)
    for event in handle:
        if isinstance(event, PrefillProgress):
            progress = (event.done, event.total)
        elif isinstance(event, Done):
            ended = time.perf_counter()
            timer.cancel()
            engine.reset()
            latency = (ended - stopped_at[0]) * 1000.0 if stopped_at else None
            return {"latency_ms": latency, "prompt_tokens": progress[1],
                    "prefilled_before_stop": progress[0], "finish_reason": event.finish_reason}
    return None
