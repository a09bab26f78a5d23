"""``localchat bench --images``: a picture encoded once and kept, turn after turn and across a
reopened session, on the model's own "colour words" projector (``synthetic_projector``: a solid
red picture reads exactly as the words " red red red red", so the replies mean something).

Per round, in one process, with greedy replies:

- turn 1: a question with a red picture (TTFT, pictures encoded, encode ms, prompt tokens);
- turn 2: a follow-up in the same conversation: pictures encoded (target 0), tokens prefilled
  (the new text alone), and the reuse (cells kept / the cells turn 1 left: target 1.0);
- warm: turn 3 on the engine that never closed; restored: the same turn 3 on a second engine
  after restoring the first one's snapshot (KV cells and records) as a reopened session does:
  pictures encoded (target 0) and TTFT (restore included) against the warm one (target <= 2x),
  and whether the two replies are the same.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from localchat.bench.synthetic_images import png
from localchat.bench.synthetic_projector import token_embeddings, write_colour_projector
from localchat.bench.targets import target
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Done, Failed, Token

COLOURS = (" red", " green", " blue")
QUESTION = "What colour is this picture?"
FOLLOW_UP = "Say it again in one word."
LAST = "Thank you. Which colour was it, once more?"


def measure_images(model_path: Path, name: str, n_ctx: int, rounds: int,
                   max_tokens: int) -> dict[str, Any]:
    """See the module docstring: each round's numbers, their medians and the targets."""
    from localchat.engine.engine import Engine

    greedy = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=max_tokens)
    with tempfile.TemporaryDirectory(prefix="localchat-bench-images-") as tmp:
        projector = _colour_projector(model_path, Path(tmp) / "colours.gguf")
        options = EngineOptions(n_ctx=n_ctx, speculative="off", mmproj=projector)
        first, second = Engine(model_path, options, name=name), Engine(model_path, options, name=name)
        try:
            first.load()
            second.load()
            rows = [_round(first, second, greedy, i) for i in range(rounds)]
        finally:
            first.close()
            second.close()
    report: dict[str, Any] = {"model": name, "n_ctx": n_ctx, "rounds": rows,
                              "summary": _summary(rows)}
    report["targets"] = image_targets(report["summary"])
    return report


def _colour_projector(model_path: Path, path: Path) -> Path:
    """The colour-words projector for ``model_path``: its own embeddings of the words."""
    from localchat.engine.engine import Engine

    words = Engine(model_path, EngineOptions(n_ctx=256, speculative="off"), name="words")
    try:
        words.load()
        ids = [words.tokenize(word)[0] for word in COLOURS]
    finally:
        words.close()
    return write_colour_projector(path, token_embeddings(model_path, ids))


def _round(first: Any, second: Any, greedy: Sampling, index: int) -> dict[str, Any]:
    picture = png(28, 28, ((255, 0, 0), (0, 255, 0), (0, 0, 255))[index % 3])
    messages = [{"role": "user", "content": QUESTION, "images": [picture]}]
    first.reset()
    one = _turn(first, messages, greedy)
    held = first.tokens_in_context  # the cells turn 1 left: its prompt, picture and reply
    messages += [{"role": "assistant", "content": one.reply}, {"role": "user", "content": FOLLOW_UP}]
    two = _turn(first, messages, greedy)
    messages += [{"role": "assistant", "content": two.reply}, {"role": "user", "content": LAST}]
    snapshot = first.export_snapshot()
    warm = _turn(first, messages, greedy)
    second.reset()
    restore_ms = second.import_snapshot(snapshot)
    restored = _turn(second, messages, greedy)
    return {
        "reply": one.reply.strip(),
        "turn1": _numbers(one),
        "turn2": {**_numbers(two), "reuse": round(two.timings.cache_n / held, 3) if held else None},
        "warm": _numbers(warm),
        "restored": {**_numbers(restored), "restore_ms": round(restore_ms, 1)},
        "restored_same_reply": restored.reply == warm.reply,
    }


def _turn(engine: Any, messages: list[dict], greedy: Sampling) -> Done:
    final = None
    for event in engine.submit(messages, greedy):
        if isinstance(event, Failed):
            from localchat.errors import UserError

            raise UserError(f"bench --images: {event.message}")
        if not isinstance(event, Token):
            final = event
    assert isinstance(final, Done)
    return final


def _numbers(done: Done) -> dict[str, Any]:
    t = done.timings
    return {"ttft_ms": round(t.ttft_ms, 1), "images_n": t.images_n, "image_ms": round(t.image_ms, 1),
            "prompt_n": t.prompt_n, "cache_n": t.cache_n}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def median(part: str, key: str) -> float:
        return round(statistics.median(r[part][key] for r in rows), 1)

    return {
        "turn1_ttft_ms": median("turn1", "ttft_ms"), "turn1_image_ms": median("turn1", "image_ms"),
        "turn2_images_n": max(r["turn2"]["images_n"] for r in rows),
        "turn2_prompt_n": median("turn2", "prompt_n"),
        "turn2_reuse_min": min(r["turn2"]["reuse"] or 0 for r in rows),
        "warm_ttft_ms": median("warm", "ttft_ms"), "restored_ttft_ms": median("restored", "ttft_ms"),
        "restored_images_n": max(r["restored"]["images_n"] for r in rows),
        "restored_same_reply": all(r["restored_same_reply"] for r in rows),
    }


def image_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 47's targets on a summary (``_summary``)."""
    ratio = (round(summary["restored_ttft_ms"] / summary["warm_ttft_ms"], 2)
             if summary["warm_ttft_ms"] else None)
    return [
        target("second message about the same picture: pictures encoded",
               summary["turn2_images_n"], 0, summary["turn2_images_n"] == 0),
        target("second message: cells kept / cells turn 1 left (min)",
               summary["turn2_reuse_min"], 1.0, summary["turn2_reuse_min"] >= 1.0),
        target("reopened session: pictures encoded", summary["restored_images_n"], 0,
               summary["restored_images_n"] == 0),
        target("reopened session: TTFT (restore included) / warm TTFT", ratio, 2.0,
               ratio is not None and ratio <= 2.0),
    ]


def print_images(report: dict[str, Any]) -> None:
    s = report["summary"]
    print(f"bench --images: {report['model']}, n_ctx {report['n_ctx']}, "
          f"{len(report['rounds'])} rounds, the colour-words projector")
    print(f"turn 1 (a picture): TTFT {s['turn1_ttft_ms']} ms, encode {s['turn1_image_ms']} ms; "
          f"replies: {', '.join(repr(r['reply']) for r in report['rounds'])}")
    print(f"turn 2 (same picture): {s['turn2_images_n']} pictures encoded, "
          f"{s['turn2_prompt_n']} tokens prefilled, reuse {s['turn2_reuse_min']}")
    print(f"reopened: TTFT {s['restored_ttft_ms']} ms against warm {s['warm_ttft_ms']} ms, "
          f"{s['restored_images_n']} pictures encoded, same reply: {s['restored_same_reply']}")
    for check in report["targets"]:
        mark = "ok" if check["ok"] else "MISS"
        print(f"  [{mark}] {check['target']}: {check['value']} (limit {check['limit']})")
