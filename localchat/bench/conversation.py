"""``localchat bench``: replay a conversation through the engine and report what a user feels.

Everything is measured in one process, on one loaded model, so ratios are comparable even on a
noisy shared machine: the engine with its KV reuse, the same turns with a fresh context each time
(what a stateless server without a prompt cache does), a system prompt changed mid-conversation,
each turn's decoding against llama.cpp's bare loop at the same depth with no engine around it,
and how fast a stop takes effect (``bench.decode``). ``measure_conversation`` runs it all and
checks the targets (``bench.targets``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat.bench import decode
from localchat.bench.script import run_turn
from localchat.bench.targets import conversation_targets
from localchat.context.chat_context import ChatContext
from localchat.context.factory import open_chat
from localchat.engine.engine import Engine
from localchat.engine.factory import open_engine
from localchat.engine.options import Sampling
from localchat.engine.sampling.sampler import PENALTY_WINDOW, apply_repeat_penalty
from localchat.events import Done, Timings
from localchat.percentiles import percentile
from localchat.settings import Settings


def measure_conversation(model: str | None, config: Settings, system: str, users: list[str], *,
                         n_ctx: int, gpu_layers: str | int | None, max_tokens: int,
                         baseline: bool, stops: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """Load ``model`` and replay ``users`` after ``system`` greedily, each turn's decode speed
    against the bare llama.cpp loop at its depth, then measure a system prompt change and
    (``stops``) stop latency; with ``baseline`` also every turn on a fresh context and the
    exactness of the cached replies. ``say`` hears each finished step. Returns the report
    ``--json`` prints, its targets checked."""
    engine = open_engine(model, config, n_ctx=n_ctx, gpu_layers=gpu_layers)
    try:
        info = engine.load()
        # Greedy (the exactness oracle needs one reply per history), with the user's repeat
        # penalty: the sampler chain a turn of the app runs, which the bare loop runs too.
        sampling = Sampling(temperature=0.0, repeat_penalty=config.sampling.repeat_penalty,
                            max_tokens=max_tokens)
        replayed, session = replay(engine, system, users, sampling, config, bare_loop=True)
        turns = [r.timings for r in replayed]
        say(f"replayed {len(turns)} turns, each against the bare decode loop at its depth")
        keeper = session.keeper
        report: dict[str, Any] = {
            "model": info.model, "n_ctx": info.n_ctx, "backend": info.backend,
            "gpu_layers": info.gpu_layers, "memory": info.memory,
            "summary_max_tokens": keeper.settings.summary_max_tokens if keeper else None,
            "turns": [t.to_dict() for t in turns], "summary": summarize(turns)}
        if baseline:
            fresh = replay_fresh(engine, replayed, sampling)
            report["baseline"] = {"turns": [r.timings.to_dict() for r in fresh],
                                  "summary": summarize([r.timings for r in fresh])}
            report["exactness"] = exactness(engine, replayed, fresh, sampling.repeat_penalty)
            say("replayed the baseline")
        installs: list[Timings] = keeper.install_timings if keeper else []
        if installs:  # summaries put in after the system prompt, prefilled in the background
            report["summary_installs"] = {
                "count": len(installs),
                "prompt_n_max": max(t.prompt_n for t in installs),
                "background_ms_max": round(max(t.prompt_ms for t in installs), 1)}
        report["system_change"] = system_change(engine, system, users, sampling, config)
        say("measured a system prompt change")
        report["raw_decode"] = decode.decode_against_raw(turns, [r.raw for r in replayed], sampling)
        if stops:
            report["abort"] = {"decoding": decode.abort_while_decoding(engine),
                               "prefill": decode.abort_during_prefill(engine)}
        report["targets"] = conversation_targets(report)
    finally:
        engine.close()
    return report


@dataclass
class Replayed:
    """One turn of a replay: its timings, its reply's tokens, what the model was shown, and
    (``replay(bare_loop=True)``) the bare decode loop at its depth (``decode.raw_decode_at_depth``)."""

    timings: Timings
    tokens: list[int]
    sent: list[dict[str, str]]
    raw: dict | None = None


def replay(engine: Engine, system: str, users: list[str], sampling: Sampling,
           config: Settings, bare_loop: bool = False) -> tuple[list[Replayed], ChatContext]:
    """Play the script through one ChatContext (with the context policy), turn by turn; with
    ``bare_loop``, time llama.cpp's bare loop right after each turn where it decoded.

    Between turns it waits until background work (a summary) is done, as a user who reads the
    reply and types the next message gives it time to; TTFT is measured from each submit.
    """
    session = open_chat(engine, config, system=system, sampling=sampling)
    turns = []
    for text in users:
        engine.wait_idle(timeout=120)
        done, tokens = run_turn(session.send(text))
        raw = (decode.raw_decode_at_depth(engine, done.timings, done.finish_reason, sampling)
               if bare_loop else None)
        turns.append(Replayed(done.timings, tokens, session.last_sent, raw))
    engine.wait_idle(timeout=120)
    return turns, session


def replay_fresh(engine: Engine, turns: list[Replayed], sampling: Sampling) -> list[Replayed]:
    """Each turn again on an empty KV cache, shown exactly what the cached turn was shown: the
    stateless-server baseline, and the oracle for KV reuse (greedy replies must be equal)."""
    fresh = []
    for turn in turns:
        engine.reset()
        done, tokens = run_turn(engine.submit(turn.sent, sampling))
        fresh.append(Replayed(done.timings, tokens, turn.sent))
    engine.reset()
    return fresh


# A greedy reply may differ from a fresh prefill's without any wrong cell: llama.cpp's kernels
# round differently for different batch shapes (a reply decoded token by token vs. the same tokens
# prefilled in one batch), and a near-tie flips. Measured on SmolLM2-135M: logits up to ~1.0
# apart (max abs over the vocabulary) between such schedules, flipping ties of 0.02-0.2 logits.
NEAR_TIE_LOGITS = 0.5


def exactness(engine: Engine, cached: list[Replayed], fresh: list[Replayed],
              repeat_penalty: float = 1.0) -> dict:
    """Compare each cached turn's greedy reply with a fresh prefill's. Where they differ, the
    fresh logits at the first differing token (teacher-forced on the cached reply) tell a
    near-tie (batch rounding) from a clear preference (a wrong cell). Turns on cells a context
    shift moved (``approx_n``) are the named approximation and are counted apart, and so are
    turns after a reply whose text does not tokenize back to the tokens sampled (the cache keeps
    what was sampled, a fresh prefill reads the text: two different histories; a random-weight
    model's word salad does this, a real model's prose rarely). The margin is taken after the
    turns' ``repeat_penalty``, as their sampler saw the logits."""
    exact = near_ties = wrong = approx = not_comparable = 0
    margins = []
    diverged = False
    for number, (c, f) in enumerate(zip(cached, fresh), 1):
        if c.timings.approx_n > 0:
            approx += 1
        elif diverged:
            not_comparable += 1
        elif c.tokens == f.tokens:
            exact += 1
        else:
            i = next((k for k, (a, b) in enumerate(zip(c.tokens, f.tokens)) if a != b), None)
            if i is None:  # one is a prefix of the other: the longer one chose not to stop
                wrong += 1
            else:
                logits = engine.fresh_logits(c.sent, c.tokens[:i])
                if repeat_penalty != 1.0:
                    apply_repeat_penalty(logits, c.tokens[:i][-PENALTY_WINDOW:], repeat_penalty)
                margin = float(logits[f.tokens[i]] - logits[c.tokens[i]])
                margins.append({"turn": number, "token": i, "margin": round(margin, 4)})
                if margin < NEAR_TIE_LOGITS:
                    near_ties += 1
                else:
                    wrong += 1
        diverged = diverged or engine.tokenize(engine.detokenize(c.tokens)) != c.tokens
    return {"turns": len(cached), "exact_turns": exact, "near_tie_turns": near_ties,
            "wrong_turns": wrong, "approx_turns": approx, "not_comparable_turns": not_comparable,
            "first_differences": margins}


def system_change(engine: Engine, system: str, users: list[str], sampling: Sampling,
                  config: Settings, turns: int = 6) -> dict:
    """A system prompt changed after ``turns`` turns. Exact reuse means every cell after it is
    computed again; that starts in the background at once. Reports how long it takes, and the
    next turn's TTFT when the user sends after it finished and when they send at once."""
    report: dict[str, Any] = {}
    for waits in (True, False):
        engine.reset()
        _, session = replay(engine, system, users[:turns], sampling, config)
        handle = session.set_system(system + " Answer in plain sentences.")
        if waits and handle is not None:
            prepared = handle.wait()
            if isinstance(prepared, Done):
                report["background_prompt_n"] = prepared.timings.prompt_n
                report["background_ms"] = round(prepared.timings.prompt_ms, 1)
        done, _ = run_turn(session.send(users[turns % len(users)]))
        key = "next_ttft_ms_after_waiting" if waits else "next_ttft_ms_sent_at_once"
        report[key] = round(done.timings.ttft_ms, 1)
        report[key.replace("ttft_ms", "prompt_n")] = done.timings.prompt_n
    engine.reset()
    return report


def summarize(turns: list[Timings]) -> dict:
    """TTFT and ITL p50/p95, decode tok/s and cache reuse over a run."""
    ttfts = [t.ttft_ms for t in turns]
    itl50 = [t.itl_p50_ms for t in turns if t.predicted_n > 1]
    itl95 = [t.itl_p95_ms for t in turns if t.predicted_n > 1]
    tokens = sum(t.predicted_n for t in turns)
    decode_ms = sum(t.predicted_ms for t in turns)
    cached = sum(t.cache_n for t in turns)
    prompt = sum(t.prompt_n for t in turns)
    return {
        "turns": len(turns),
        "ttft_p50_ms": round(percentile(ttfts, 50), 1),
        "ttft_p95_ms": round(percentile(ttfts, 95), 1),
        "itl_p50_ms": round(statistics.median(itl50), 2) if itl50 else 0.0,
        "itl_p95_ms": round(statistics.median(itl95), 2) if itl95 else 0.0,
        "tpot_ms": round(_mean_tpot(turns), 2),
        "tokens_per_second": round(1000.0 * tokens / decode_ms, 1) if decode_ms else 0.0,
        "reuse_pct": round(100.0 * cached / (cached + prompt), 1) if cached + prompt else 0.0,
        "max_ttft_minus_prompt_ms": round(max(t.ttft_ms - t.prompt_ms for t in turns), 1),
        "median_ttft_minus_prompt_ms": round(statistics.median(t.ttft_ms - t.prompt_ms for t in turns), 2),
        "max_n_ctx_used": max(t.n_ctx_used for t in turns),
        "trims": sum(1 for t in turns if t.trimmed_n),
        # Models whose memory cannot drop turns prefill the kept ones again when trimming.
        "rebuilds": sum(1 for t in turns if t.rebuild),
        "rebuild_n_foreground": sum(t.rebuild_n for t in turns),
        "rebuild_n_background": sum(t.rebuild_background_n for t in turns),
        "rebuild_background_ms": round(sum(t.rebuild_background_ms for t in turns), 1),
    }


def _mean_tpot(turns: list[Timings]) -> float:
    """Token-weighted mean time per output token after the first."""
    weighted = [(t.tpot_ms, t.predicted_n - 1) for t in turns if t.predicted_n > 1]
    total = sum(n for _, n in weighted)
    return sum(tpot * n for tpot, n in weighted) / total if total else 0.0
