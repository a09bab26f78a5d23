#!/usr/bin/env python3
"""Measure what dropping earlier turns' reasoning from the context costs, per turn.

    python scripts/reasoning_history.py [MODEL.gguf] [--turns N]

The test model (SmolLM2-135M) never writes ``</think>`` itself, so a Qwen3-style template writes a
fixed reasoning block and the model writes the answer (tests/reasoning_templates.py): the KV cache
then holds header, reasoning, answer, as it does after a real reasoning model's turn.

- ``strip``: the template drops earlier reasoning (Qwen3's). The engine reuses the longest common
  token prefix, up to the previous reply's header, and re-prefills the previous answer, the new
  message and the next header: exact, what localchat does.
- ``keep``: the same turns with the reasoning left in history: only the new message is prefilled.
  Removing the reasoning cells and shifting the answer down (``llama_memory_seq_rm`` +
  ``llama_memory_seq_add``) would prefill the same tokens, plus the shift, whose time is measured
  separately here; its shifted cells still attended to the removed reasoning (an approximation).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from localchat.engine.engine import Engine  # noqa: E402
from localchat.engine.options import EngineOptions, Sampling  # noqa: E402
from localchat.events import Done  # noqa: E402
from reasoning_templates import CANNED_REASONING, STRIPS_REASONING, qwen3_style  # noqa: E402

QUESTIONS = ["Hello, who are you?", "What is the capital of France?", "And of Italy?",
             "Which of the two is larger?", "Name a famous dish from each.", "Thanks, bye!"]

# The same generation prompt; earlier turns keep their reasoning block in history.
KEEPS_REASONING = STRIPS_REASONING.replace(
    "{{- '<|im_start|>assistant\\n' + content }}",
    "{{- '<|im_start|>assistant\\n<think>\\n" + CANNED_REASONING + "\\n</think>\\n\\n' + content }}")


def chat(model: Path, template: str, turns: int) -> list[Done]:
    engine = Engine(model, EngineOptions(n_ctx=2048, gpu_layers=0, chat_template=template), name="m")
    engine.load()
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=32)
    history: list[dict[str, str]] = []
    results = []
    try:
        for question in QUESTIONS[:turns]:
            history.append({"role": "user", "content": question})
            done = [e for e in engine.submit(history, sampling) if isinstance(e, Done)][0]
            history.append({"role": "assistant", "content": done.reply})
            results.append(done)
    finally:
        engine.close()
    return results


def shift_ms(model: Path, reasoning_tokens: int) -> float:
    """Time of removing ``reasoning_tokens`` cells from a 300-token cache and moving the rest down."""
    engine = Engine(model, EngineOptions(n_ctx=2048, gpu_layers=0), name="m")
    engine.load()
    try:
        def shift() -> float:
            runtime = engine._require_kv().runtime
            runtime.clear()
            runtime.decode(list(range(100, 400)), 0)  # any 300 tokens
            started = time.perf_counter()
            runtime.remove(200 - reasoning_tokens, 200)
            runtime.move(200, -1, -reasoning_tokens)
            return (time.perf_counter() - started) * 1000.0

        return min(engine.call(shift) for _ in range(3))
    finally:
        engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = Path(os.path.expanduser("~/.cache/localchat-tests/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("model", nargs="?", type=Path, default=default)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    strip, keep = chat(args.model, STRIPS_REASONING, args.turns), chat(args.model, KEEPS_REASONING, args.turns)
    print("turn │ strip: prompt_n cache_n ttft_ms ctx fallback │ keep: prompt_n cache_n ttft_ms ctx")
    for i, (s, k) in enumerate(zip(strip, keep), 1):
        a, b = s.timings, k.timings
        print(f"{i:4} │ {a.prompt_n:8} {a.cache_n:7} {a.ttft_ms:7.0f} {a.n_ctx_used:4} {str(a.prefix_fallback):8}"
              f" │ {b.prompt_n:8} {b.cache_n:7} {b.ttft_ms:7.0f} {b.n_ctx_used:4}")
    reasoning_n = 30  # about the canned block's tokens
    print(f"remove {reasoning_n} reasoning cells and shift the rest down: {shift_ms(args.model, reasoning_n):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
