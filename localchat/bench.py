"""``localchat bench``: replay a conversation through the engine and report what a user feels.

Everything is measured in one process, on one loaded model, so ratios are comparable even on a
noisy shared machine: the engine with its KV reuse, the same turns with a fresh context each time
(what a stateless server without a prompt cache does), the raw llama.cpp decode loop with no engine
around it, and how fast a stop takes effect while decoding and in the middle of a long prefill.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from localchat.engine.engine import Engine
from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.events import Done, Failed, PrefillProgress, Timings, Token
from localchat.session.chat import ChatSession
from localchat.session.factory import open_chat
from localchat.settings import Settings

DEFAULT_SYSTEM = "You are a concise, helpful assistant."
# Questions of ~50-70 tokens each: with 48-token replies a turn adds ~120 tokens, as in ANCHORS.
DEFAULT_QUESTIONS = [
    "I am planning a small vegetable garden on a sunny balcony in a city apartment. Which three "
    "vegetables are easiest for a beginner to grow in pots, and how often should I water them?",
    "Thanks. The balcony faces south and gets very hot in July and August. What can I do to keep "
    "the soil from drying out completely while I am away at work during the day?",
    "Good ideas. Should I use potting mix from a store, or can I mix my own soil with compost "
    "from the kitchen scraps I have been collecting in a bin under the sink?",
    "I have read that tomatoes need support as they grow taller. What kind of support works on a "
    "balcony where I cannot drive stakes into the ground, and when should I add it?",
    "Some leaves on my basil are turning yellow at the bottom of the plant. Is that caused by "
    "too much water, too little water, or something missing from the soil?",
    "What is a simple weekly routine I could follow on Sunday mornings to keep all of these "
    "plants healthy without spending more than twenty minutes on it?",
    "My neighbour suggested companion planting. Which of the vegetables we discussed grow well "
    "together in the same large container, and which ones should be kept apart?",
    "When autumn comes and the nights get cold, which plants can stay outside, which should come "
    "indoors, and what should I do with the soil in the empty pots over winter?",
    "Could you suggest a couple of herbs that would grow well indoors on a kitchen windowsill "
    "during the winter months, and tell me how much light they really need?",
    "Finally, please summarise the most important three pieces of advice from our whole "
    "conversation in a short list that I can print and stick on my fridge.",
]


def load_script(path: Path | None, turns: int | None) -> tuple[str, list[str]]:
    """(system prompt, user messages) from a JSONL script, or the built-in one (cycled to ``turns``)."""
    if path is None:
        questions = DEFAULT_QUESTIONS
        count = turns or len(questions)
        users = [_variant(questions[i % len(questions)], i // len(questions)) for i in range(count)]
        return DEFAULT_SYSTEM, users
    system, users = "", []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"cannot read bench script {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            role, content = item["role"], item["content"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}:{number}: expected {{\"role\": ..., \"content\": ...}}") from None
        if role == "system":
            system = content
        elif role == "user":
            users.append(content)
        else:
            raise UserError(f"{path}:{number}: role must be system or user, not {role!r}")
    if not users:
        raise UserError(f"{path} has no user messages")
    return system, users[:turns] if turns else users


def _variant(question: str, round_: int) -> str:
    return question if round_ == 0 else f"(Round {round_ + 1}) {question}"


def run_turn(handle) -> tuple[Done, list[int]]:
    """Drain a turn; (final event, the reply's token ids) — raises on Failed."""
    final, tokens = None, []
    for event in handle:
        if isinstance(event, Token):
            tokens.append(event.token_id)
        elif isinstance(event, (Done, Failed)):
            final = event
    if isinstance(final, Failed):
        raise UserError(f"turn failed: {final.message}")
    return final, tokens


@dataclass
class Replayed:
    """One turn of a replay: its timings, its reply's tokens, and what the model was shown."""

    timings: Timings
    tokens: list[int]
    sent: list[dict[str, str]]


def replay(engine: Engine, system: str, users: list[str], sampling: Sampling,
           config: Settings) -> tuple[list[Replayed], ChatSession]:
    """Play the script through one ChatSession (with the context policy), turn by turn.

    Between turns it waits until background work (a summary) is done, as a user who reads the
    reply and types the next message gives it time to; TTFT is measured from each submit.
    """
    session = open_chat(engine, config, system=system, sampling=sampling)
    turns = []
    for text in users:
        engine.wait_idle(timeout=120)
        done, tokens = run_turn(session.send(text))
        turns.append(Replayed(done.timings, tokens, session.last_sent))
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


def exactness(engine: Engine, cached: list[Replayed], fresh: list[Replayed]) -> dict:
    """Compare each cached turn's greedy reply with a fresh prefill's. Where they differ, the
    fresh logits at the first differing token (teacher-forced on the cached reply) tell a
    near-tie (batch rounding) from a clear preference (a wrong cell). Turns on cells a context
    shift moved (``approx_n``) are the named approximation and are counted apart, and so are
    turns after a reply whose text does not tokenize back to the tokens sampled (the cache keeps
    what was sampled, a fresh prefill reads the text: two different histories; a random-weight
    model's word salad does this, a real model's prose rarely)."""
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
    report: dict = {}
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


STORY_PROMPT = "Tell me a long story about a lighthouse keeper."


def decode_speed(engine: Engine, n_tokens: int = 128, rounds: int = 3) -> dict:
    """Engine decode speed against llama.cpp with no engine around it, measured alternately in
    the same window (a shared machine drifts): the raw loop is ``Llama.eval([token])`` + argmax
    over the last logits; the engine is a greedy turn on the same prompt. Medians of ``rounds``."""
    raw, engine_ms = [], []
    for _ in range(rounds):
        raw.append(_raw_loop_ms_per_token(engine, n_tokens))
        engine.reset()
        session = ChatSession(engine, sampling=Sampling(temperature=0, repeat_penalty=1.0,
                                                        max_tokens=n_tokens))
        done, _ = run_turn(session.send(STORY_PROMPT))
        engine_ms.append(done.timings.tpot_ms)
    engine.reset()
    raw_ms, eng_ms = statistics.median(raw), statistics.median(engine_ms)
    return {"raw_ms_per_token": round(raw_ms, 2), "engine_ms_per_token": round(eng_ms, 2),
            "engine_speed_ratio": round(raw_ms / eng_ms, 3) if eng_ms else 0.0}


def _raw_loop_ms_per_token(engine: Engine, n_tokens: int) -> float:
    import numpy as np

    def loop() -> float:
        runtime = engine._require_runtime()
        llama = runtime.llama
        runtime.clear()
        llama.reset()
        prompt = engine._render([{"role": "user", "content": STORY_PROMPT}], True)
        llama.eval(runtime.tokenize(prompt, True))
        started = time.perf_counter()
        for _ in range(n_tokens):
            token = int(np.argmax(runtime.last_logits()))
            llama.eval([token])
        elapsed = time.perf_counter() - started
        runtime.clear()
        llama.reset()
        return elapsed * 1000.0 / n_tokens

    result = engine.call(loop)
    engine.reset()
    return result


def abort_while_decoding(engine: Engine, after_tokens: int = 16) -> dict:
    """Stop a reply after a few tokens; ms from stop() to the final Done event."""
    engine.reset()
    session = ChatSession(engine, system=DEFAULT_SYSTEM, sampling=Sampling(temperature=0, max_tokens=400))
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
    import threading

    n_ctx = engine.n_ctx
    if n_ctx < prompt_tokens + 64:
        return None
    engine.reset()
    document = " ".join(f"word{i % 97}" for i in range(prompt_tokens))
    while engine.count_tokens(document) > prompt_tokens:
        document = document[: int(len(document) * 0.95)]
    session = ChatSession(engine, sampling=Sampling(temperature=0, max_tokens=8))
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


def summarize(turns: list[Timings]) -> dict:
    """TTFT and ITL p50/p95, decode tok/s and cache reuse over a run."""
    from localchat.engine.turn import percentile

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
