"""Decode speed and stop latency: each turn's tokens against llama.cpp's bare loop at the same
context depth with the same sampler, and how fast a stop takes effect while decoding and in the
middle of a long prefill."""

from __future__ import annotations

import statistics
import threading
import time

from localchat.bench.script import DEFAULT_SYSTEM
from localchat.context.chat_context import ChatContext
from localchat.engine.engine import Engine
from localchat.engine.kv import ConversationCache
from localchat.engine.options import Sampling
from localchat.errors import EngineError, UserError
from localchat.events import Done, PrefillProgress, Timings, Token


def raw_decode_at_depth(engine: Engine, timings: Timings, finish: str, sampling: Sampling) -> dict | None:
    """llama.cpp's bare decode loop where the turn just decoded, in ms per token: the reply's
    cells are dropped and decoded again one ``llama_decode`` per token at the same positions,
    each followed by the turn's own sampler (``sampling``: repeat penalty, temperature) on the
    new logits; no events, no record. It runs on the thread count the engine's governor holds
    (every core on an idle machine, as llama.cpp's default): what a turn's own tries of another
    count cost shows, while the governor's choice is the same on both sides. The loop feeds the
    reply's tokens whatever it samples, so the cells end as the turn left them (same tokens,
    same positions, same one-token batches; greedily it samples the reply again anyway).

    ``timings`` and ``finish`` are the turn's (after "stop" every sampled token is in the
    cache; otherwise the last one is not). Runs on the engine thread after queued work. None
    when the turn decoded nothing, when the cache no longer ends with the reply where the turn
    left it (background work moved it), or when the memory cannot drop the reply's cells
    (recurrent, hybrid and windowed caches roll back through checkpoints instead).
    """
    import llama_cpp

    n_decoded = timings.predicted_n if finish == "stop" else timings.predicted_n - 1
    depth = timings.n_ctx_used - n_decoded

    def bare_loop(cache: ConversationCache) -> dict | None:
        runtime = cache.runtime
        held = cache.tokens()
        reply = cache.records[-1] if cache.records else None
        if (n_decoded <= 0 or runtime.needs_checkpoints or len(held) != timings.n_ctx_used
                or reply is None or not reply.open or len(reply.tokens) < n_decoded):
            return None
        start, decoded = depth, held[depth:]
        sampler = runtime.new_sampler(sampling)
        batch = llama_cpp.llama_batch_init(1, 0, 1)
        batch.n_tokens, batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 1, 1, 0, True
        decode, sample, ctx = llama_cpp.llama_decode, sampler.sample, runtime.ctx
        try:
            if not runtime.remove(start, -1):
                raise EngineError("the bare decode loop could not drop the reply's cells")
            started = time.perf_counter()
            for i, token in enumerate(decoded):
                batch.token[0], batch.pos[0] = token, start + i
                if decode(ctx, batch) != 0:
                    raise EngineError("llama_decode failed in the bare decode loop")
                sample()
            elapsed_ms = (time.perf_counter() - started) * 1000.0
        except Exception:
            cache.forget()  # cells the record no longer describes: start clean, never wrong
            raise
        finally:
            llama_cpp.llama_batch_free(batch)
            sampler.close()
        return {"depth": start, "tokens": len(decoded), "threads": runtime.governor.threads,
                "raw_ms_per_token": round(elapsed_ms / len(decoded), 3)}

    return engine.with_cache(bare_loop)


def decode_against_raw(turns: list[Timings], raw: list[dict | None], sampling: Sampling) -> dict:
    """Each turn's TPOT against the bare loop at its depth (``raw_decode_at_depth``, one per
    turn): ``decode_vs_raw`` per turn (bare ms / engine ms: 1.0 is the bare loop's speed), and
    their median and minimum. Turns without a TPOT or a bare measurement are left out."""
    rows = []
    for number, (timings, bare) in enumerate(zip(turns, raw), 1):
        if bare is None or timings.predicted_n < 2 or timings.tpot_ms <= 0:
            continue
        rows.append({"turn": number, **bare, "tpot_ms": round(timings.tpot_ms, 3),
                     "decode_vs_raw": round(bare["raw_ms_per_token"] / timings.tpot_ms, 3)})
    ratios = [row["decode_vs_raw"] for row in rows]
    return {"sampling": {"temperature": sampling.temperature, "repeat_penalty": sampling.repeat_penalty},
            "turns": rows,
            "decode_vs_raw_median": round(statistics.median(ratios), 3) if ratios else None,
            "decode_vs_raw_min": min(ratios) if ratios else None}


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
