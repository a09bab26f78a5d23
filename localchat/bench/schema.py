"""``localchat bench --schema [SET.jsonl]``: answers in a shape, how valid and how fast, side by side
with llama-cpp-python's own ``response_format`` path, in one run on one model file.

Each line of the set is ``{"name": ..., "prompt": ..., "schema": {...}}`` (the shipped set: nested
objects, arrays, enums, required fields, integers, numbers, booleans, nullable ones, a $ref, a
date). Every prompt is answered, greedily and ``rounds`` times, four ways:

- localchat with the schema (the engine's constrained sampling), the reply parsed and validated;
- the same reply's tokens decoded again without the constraint, by llama.cpp's bare decode loop
  at the same depth with the same sampler (``bench.decode.raw_decode_at_depth``): what those
  tokens cost unconstrained, so ``ratio`` = schema tok/s over that is the constraint's price (and
  the engine's own, a few percent);
- llama-cpp-python's ``Llama.create_chat_completion`` with ``response_format={"type":
  "json_object", "schema": ...}`` (its grammar over the whole vocabulary every token), its reply
  parsed and validated, and the same call without ``response_format``: its own ratio (generated
  tokens over the call's time after the prompt; a free reply is another reply, so its own
  length and depth: the ratio compares per-token cost).

Also: how long each schema takes to become a grammar. The targets: every localchat reply parses
and validates, the median ratio is at least 0.9, and no schema takes over 50 ms to convert.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from localchat.bench.decode import raw_decode_at_depth
from localchat.bench.script import read_rows
from localchat.bench.targets import target
from localchat.engine.engine import Engine
from localchat.engine.options import Sampling, shaped
from localchat.errors import FormatError, UserError
from localchat.events import Done
from localchat.formats import AnswerFormat, schema_format

CONVERT_LIMIT_MS = 50.0
RATIO_LIMIT = 0.9


def shipped_set() -> Path:
    return Path(str(resources.files("localchat.bench").joinpath("data/schemas.jsonl")))


def read_set(path: Path) -> list[tuple[str, str, dict]]:
    """(name, prompt, schema) per line of a schema set; a bad file is a one-line UserError."""
    return [(str(row["name"]), str(row["prompt"]), row["schema"])
            for _, row in read_rows(path, "schema set", ("name", "prompt", "schema"))]


def measure_schemas(model_path: Path, model_name: str, path: Path, *, n_ctx: int, max_tokens: int,
                    repeat_penalty: float, rounds: int, say: Callable[[str], None],
                    compare: bool = True) -> dict[str, Any]:
    """The report ``--json`` prints, its targets checked (see the module docstring)."""
    from localchat.engine.options import EngineOptions

    formats = []
    for name, prompt, schema in read_set(path):
        started = time.perf_counter()
        try:
            answer_format = schema_format(schema, name)
        except FormatError as exc:
            raise UserError(f"{path}: schema {name!r}: {exc}") from None
        formats.append((name, prompt, answer_format, (time.perf_counter() - started) * 1000))
    greedy = Sampling(temperature=0.0, repeat_penalty=repeat_penalty, max_tokens=max_tokens)
    engine = Engine(model_path, EngineOptions(n_ctx=n_ctx, gpu_layers=0, speculative="off"),
                    name=model_name)
    try:
        info = engine.load()
        n_vocab = engine.n_vocab
        _answer(engine, "Hello!", greedy)  # warm-up
        rows = []
        for name, prompt, answer_format, convert_ms in formats:
            runs = [_localchat(engine, prompt, greedy, answer_format) for _ in range(rounds)]
            rows.append({"name": name, "convert_ms": round(convert_ms, 2),
                         **_summed(runs, ("tok_s", "same_reply_tok_s", "free_tok_s", "ratio"))})
            say(f"{name}: localchat {rows[-1]['ratio']}x of the same reply unconstrained")
    finally:
        engine.close()
    if compare:
        with _llama_cpp_python(model_path, n_ctx) as llm:
            for row, (name, prompt, answer_format, _) in zip(rows, formats):
                runs = [_llama_cpp_python_run(llm, prompt, answer_format, greedy)
                        for _ in range(rounds)]
                row["llama_cpp_python"] = _summed(runs, ("tok_s", "free_tok_s", "ratio"))
                say(f"{name}: llama-cpp-python {row['llama_cpp_python']['ratio']}x")
    report: dict[str, Any] = {
        "model": info.model, "backend": info.backend, "n_vocab": n_vocab, "set": str(path),
        "max_tokens": max_tokens, "repeat_penalty": repeat_penalty, "rounds": rounds,
        "schemas": rows,
        "median_ratio": _median(r["ratio"] for r in rows),
    }
    if compare:
        report["llama_cpp_python_median_ratio"] = _median(r["llama_cpp_python"]["ratio"] for r in rows)
    report["targets"] = _targets(report)
    return report


def _localchat(engine: Engine, prompt: str, greedy: Sampling, answer_format: AnswerFormat) -> dict:
    """One constrained reply, its tokens again unconstrained (bare loop), and a free reply."""
    done = _answer(engine, prompt, shaped(greedy, answer_format))
    bare = raw_decode_at_depth(engine, done.timings, done.finish_reason, greedy)
    free = _answer(engine, prompt, greedy)
    t = done.timings
    tok_s = 1000 / t.tpot_ms if t.tpot_ms else None
    same = 1000 / bare["raw_ms_per_token"] if bare else None
    return {"valid": answer_format.verdict(done.answer, done.finish_reason) is None,
            "reply": done.answer, "tokens": t.predicted_n, "tok_s": tok_s,
            "same_reply_tok_s": same, "free_tok_s": 1000 / free.timings.tpot_ms
            if free.timings.tpot_ms else None,
            "ratio": tok_s / same if tok_s and same else None,
            "redrawn": t.redrawn_n, "vocab_passes": t.vocab_passes}


def _answer(engine: Engine, prompt: str, sampling: Sampling) -> Done:
    engine.reset()
    final = None
    for event in engine.submit([{"role": "user", "content": prompt}], sampling):
        final = event
    if not isinstance(final, Done):
        raise UserError(f"the bench turn failed: {getattr(final, 'message', final)}")
    return final


@contextlib.contextmanager
def _llama_cpp_python(model_path: Path, n_ctx: int) -> Iterator[Any]:
    """llama-cpp-python's own ``Llama`` on the same file, the same threads (its output quiet)."""
    import llama_cpp

    from localchat.engine.runtime import physical_cores

    with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
        llm = llama_cpp.Llama(str(model_path), n_ctx=n_ctx, n_threads=physical_cores(),
                              n_threads_batch=physical_cores(), verbose=False)
    try:
        yield llm
    finally:
        llm.close()


def _llama_cpp_python_run(llm: Any, prompt: str, answer_format: AnswerFormat,
                          greedy: Sampling) -> dict:
    """One reply through ``create_chat_completion`` with the schema, one without."""
    shaped_reply, tok_s = _stream(llm, prompt, greedy, {"type": "json_object",
                                                        "schema": answer_format.schema})
    _, free_tok_s = _stream(llm, prompt, greedy, None)
    return {"valid": answer_format.problem(shaped_reply) is None, "reply": shaped_reply,
            "tok_s": tok_s, "free_tok_s": free_tok_s,
            "ratio": tok_s / free_tok_s if tok_s and free_tok_s else None}


def _stream(llm: Any, prompt: str, greedy: Sampling, response_format: dict | None) -> tuple[str, float | None]:
    """The reply's text and its decode speed: generated tokens per second of the call after
    its prompt was evaluated (llama.cpp's own count of that time). Counting streamed chunks would
    miss tokens without text, which a random-weight model samples most of the time."""
    import llama_cpp

    ctx = llm._ctx.ctx
    llama_cpp.llama_perf_context_reset(ctx)
    started = time.perf_counter()
    answer = llm.create_chat_completion(
        [{"role": "user", "content": prompt}], temperature=0.0, max_tokens=greedy.max_tokens,
        repeat_penalty=greedy.repeat_penalty, response_format=response_format)
    elapsed = time.perf_counter() - started
    prompt_s = llama_cpp.llama_perf_context(ctx).t_p_eval_ms / 1000
    tokens = answer["usage"]["completion_tokens"]
    decode_s = elapsed - prompt_s
    speed = tokens / decode_s if tokens > 1 and decode_s > 0 else None
    return answer["choices"][0]["message"]["content"] or "", speed


def _summed(runs: list[dict], speeds: tuple[str, ...]) -> dict[str, Any]:
    """The rounds of one schema: medians of the speeds, valid if every reply was."""
    out: dict[str, Any] = {"valid": all(r["valid"] for r in runs)}
    for key in speeds:
        out[key] = _median(r[key] for r in runs)
    for key in ("tokens", "redrawn", "vocab_passes"):
        if key in runs[0]:
            out[key] = runs[0][key]
    out["reply"] = runs[0]["reply"]
    return out


def _median(values: Iterator[float | None] | Any) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 3) if kept else None


def _targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = report["schemas"]
    valid = sum(r["valid"] for r in rows)
    slowest = max(r["convert_ms"] for r in rows)
    ratio = report["median_ratio"]
    return [
        target("localchat replies that parse and validate", f"{valid}/{len(rows)}", "all",
               valid == len(rows)),
        target("tok/s with the schema / the same reply unconstrained (median)", ratio,
               RATIO_LIMIT, ratio is not None and ratio >= RATIO_LIMIT),
        target("schema to grammar (ms, slowest)", slowest, CONVERT_LIMIT_MS,
               slowest <= CONVERT_LIMIT_MS),
    ]


def print_schemas(report: dict[str, Any]) -> None:
    """The report as a table: localchat's columns, then llama-cpp-python's."""
    print(f"model {report['model']} · {report['backend']} · vocabulary {report['n_vocab']:,} · "
          f"greedy, repeat_penalty {report['repeat_penalty']}, max_tokens {report['max_tokens']}, "
          f"{report['rounds']} rounds (medians)")
    compare = "llama_cpp_python_median_ratio" in report
    head = (f"{'schema':<8} {'valid':>5} {'tok':>4} {'tok/s':>6} {'same':>6} {'ratio':>5} "
            f"{'redraw':>6} {'full':>4} {'ms':>5}")
    if compare:
        head += f" │ {'llama-cpp-python:':<17} {'valid':>5} {'tok/s':>6} {'free':>6} {'ratio':>5}"
    print(head)
    for row in report["schemas"]:
        line = (f"{row['name']:<8} {_yes(row['valid']):>5} {row['tokens']:>4} {_n(row['tok_s']):>6} "
                f"{_n(row['same_reply_tok_s']):>6} {_n(row['ratio'], 2):>5} {row['redrawn']:>6} "
                f"{row['vocab_passes']:>4} {row['convert_ms']:>5.1f}")
        if compare:
            other = row["llama_cpp_python"]
            line += (f" │ {'':<17} {_yes(other['valid']):>5} {_n(other['tok_s']):>6} "
                     f"{_n(other['free_tok_s']):>6} {_n(other['ratio'], 2):>5}")
        print(line)
    tail = f"{'median':<8} {'':>5} {'':>4} {'':>6} {'':>6} {_n(report['median_ratio'], 2):>5}"
    if compare:
        tail += f" {'':>6} {'':>4} {'':>5} │ {'':<17} {'':>5} {'':>6} {'':>6} " \
                f"{_n(report['llama_cpp_python_median_ratio'], 2):>5}"
    print(tail)
    print("tok/s: with the schema; same: the same reply's tokens unconstrained (bare llama.cpp "
          "loop); free: its reply without response_format; redraw/full: rejected draws drawn "
          "again, and of those over the whole vocabulary; ms: schema to grammar")
    for check in report["targets"]:
        mark = "ok" if check["ok"] else "MISS"
        print(f"[{mark}] {check['target']}: {check['value']} (limit {check['limit']})")


def _n(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _yes(value: bool) -> str:
    return "yes" if value else "NO"

