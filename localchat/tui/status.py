"""The status bar: what the model is doing and what the current or last reply cost.

Two lines, so every field fits in 80 columns (a narrower terminal drops the least useful fields,
whole, down to the model, the state, TTFT and TPOT at 40 columns)::

    smollm2-135m · CPU │ generating │ ctx 412/4096 ▮▯▯▯▯▯▯▯ 10% │ local
    TTFT 182 ms │ TPOT 11.4 ms │ 87.7 tok/s │ reused 310 · new 24

After ``/format`` the first line ends with the shape asked of answers (``│ schema {name, age}``).

A thinking model's reply also shows when its answer began: ``TTFT 180 ms · answer 4.2 s``.
While a reply streams, TTFT/TPOT/tok/s are measured here as tokens arrive; when it ends they are
replaced by the engine's own timings (``Done.timings``), which are the authoritative numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.text import Text
from textual.widget import Widget

from localchat.events import Loaded, Timings

DASH = "–"


@dataclass
class StatusInfo:
    model: str = ""
    backend: str = ""  # "CPU" or "GPU 28/28"
    state: str = "starting"  # loading 40% / prefilling 12/300 / generating / idle / stopped
    ttft_ms: float | None = None
    answer_ms: float | None = None  # thinking models: submitted -> first answer token
    tpot_ms: float | None = None
    tokens_per_s: float | None = None
    cache_n: int | None = None  # prompt tokens reused from the KV cache
    prompt_n: int | None = None  # prompt tokens prefilled
    n_ctx_used: int = 0
    n_ctx: int = 0
    route: str = "local"
    draft_acceptance: float | None = None  # share of drafted tokens accepted (speculation)
    answer_format: str = ""  # /format's shape ("json", "schema {name, age}"); "" = none

    def show_loaded(self, loaded: Loaded) -> None:
        self.model, self.backend, self.n_ctx = loaded.model, backend_label(loaded), loaded.n_ctx

    def show_timings(self, timings: Timings) -> None:
        """The finished turn's numbers, as the engine measured them."""
        self.ttft_ms = timings.ttft_ms if timings.predicted_n else None  # stopped before any token
        self.answer_ms = timings.time_to_answer_ms if timings.thinking_n else None
        self.tpot_ms = timings.tpot_ms if timings.predicted_n > 1 else None
        self.tokens_per_s = timings.predicted_per_second or None
        self.cache_n, self.prompt_n = timings.cache_n, timings.prompt_n
        if _fills_local_context(timings.route):
            self.n_ctx_used = timings.n_ctx_used
            self.n_ctx = timings.n_ctx or self.n_ctx
        self.route = timings.route or "local"
        self.draft_acceptance = timings.draft_acceptance

    def estimate_context(self, tokens: int) -> None:
        """The local context holds about ``tokens`` while a reply streams (until ``Done`` brings
        the engine's count); a reply from the remote model leaves it as it was."""
        if _fills_local_context(self.route):
            self.n_ctx_used = tokens


def _fills_local_context(route: str) -> bool:
    """Whether a reply on ``route`` is in the local model's context: the remote model's never is."""
    return route != "remote"


def backend_label(loaded: Loaded) -> str:
    """``GPU n/m`` when layers are offloaded, else ``CPU``; plus the memory kind when it is not
    a plain KV cache (a recurrent or hybrid model rebuilds turns when it trims)."""
    where = f"GPU {loaded.gpu_layers}/{loaded.n_layers}" if loaded.gpu_layers > 0 else "CPU"
    return where if loaded.memory == "kv" else f"{where} · {loaded.memory}"


def _number(value: float | None, digits: int = 0) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def _context_bar(used: int, total: int, cells: int = 8) -> str:
    filled = min(cells, round(cells * used / total)) if total else 0
    return "▮" * filled + "▯" * (cells - filled)


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


SEPARATOR = " │ "
Reduction = tuple[str, str | None]  # (field, its shorter form) or (field, None): drop it


def _fitted(fields: dict[str, str], reductions: list[Reduction], width: int) -> dict[str, str]:
    """``fields`` after as few of ``reductions`` as it takes, in order, for their line to fit
    in ``width`` (all of them if it never does): a field is shown whole or not at all."""
    fields = dict(fields)
    for name, shorter in reductions:
        if len(SEPARATOR.join(fields.values())) <= width:
            break
        if name not in fields:
            continue
        if shorter is None:
            del fields[name]
        else:
            fields[name] = shorter
    return fields


def render_status(info: StatusInfo, width: int = 200) -> tuple[str, str]:
    """The two status lines as plain text, each at most ``width`` characters. Where they do not
    fit, the least useful fields go first (a field is never cut mid-word): the context bar's
    glyphs, the backend, the route, the context's token counts, then the context; on the second
    line the new-token count, tokens/s (TPOT says it too), the reuse, the answer time, then TPOT.
    The model and the state always stay; a model name too long even for that is shortened."""
    return _first_line(info, width), _second_line(info, width)


def _first_line(info: StatusInfo, width: int) -> str:
    if info.n_ctx:
        percent = 100 * info.n_ctx_used // info.n_ctx
        counts = f"ctx {info.n_ctx_used}/{info.n_ctx}"
        context = [f"{counts} {_context_bar(info.n_ctx_used, info.n_ctx)} {percent}%", f"{counts} {percent}%",
                   f"ctx {percent}%"]
    else:
        context = [f"ctx {DASH}"] * 3
    model = info.model or "no model"
    fields = {"model": f"{model} · {info.backend}" if info.backend else model, "state": info.state,
              "context": context[0], "route": info.route}
    if info.answer_format:  # the shape asked of answers: kept longest after model and state
        fields["format"] = info.answer_format
    kind = info.answer_format.split(" ")[0]  # "schema {name, age}" -> "schema"
    kept = _fitted(fields, [("context", context[1]), ("format", kind), ("model", model),
                            ("route", None), ("context", context[2]), ("context", None)], width)
    rest = SEPARATOR + SEPARATOR.join(v for k, v in kept.items() if k != "model")
    return _fit(_fit(kept["model"], max(12, width - len(rest))) + rest, width)


def _second_line(info: StatusInfo, width: int) -> str:
    ttft = f"TTFT {_number(info.ttft_ms)} ms"
    answer = ttft
    if info.answer_ms is not None:
        answer += f" · answer {info.answer_ms / 1000:.1f} s" if info.answer_ms else " · no answer"
    reused = f"reused {DASH if info.cache_n is None else info.cache_n}"
    fields = {"ttft": answer, "tpot": f"TPOT {_number(info.tpot_ms, 1)} ms",
              "speed": f"{_number(info.tokens_per_s, 1)} tok/s",
              "reused": reused if info.cache_n is None else f"{reused} · new {info.prompt_n}"}
    if info.draft_acceptance is not None:
        fields["draft"] = f"draft {100 * info.draft_acceptance:.0f}%"
    kept = _fitted(fields, [("reused", reused), ("draft", None), ("speed", None), ("reused", None),
                            ("ttft", ttft), ("tpot", None)], width)
    return _fit(SEPARATOR.join(kept.values()), width)


@dataclass
class LiveMeter:
    """TTFT, TPOT and tokens/s of the reply now streaming, measured as its tokens arrive."""

    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0

    def token(self, count: int = 1) -> None:
        """``count`` tokens just arrived (merged updates carry several)."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.tokens += count

    def apply(self, info: StatusInfo) -> None:
        if self.first_token_at is None or self.last_token_at is None:
            return
        info.ttft_ms = (self.first_token_at - self.submitted_at) * 1000
        # The last turn's figures, which this one's timings bring when it ends: not shown beside
        # this turn's TTFT as if they were its own.
        info.answer_ms = info.cache_n = info.prompt_n = info.draft_acceptance = None
        if self.tokens > 1:
            info.tpot_ms = (self.last_token_at - self.first_token_at) * 1000 / (self.tokens - 1)
            info.tokens_per_s = 1000 / info.tpot_ms if info.tpot_ms > 0 else None


class StatusBar(Widget):
    """Renders a ``StatusInfo``; call ``refresh()`` after changing ``info`` (repaints coalesce,
    so updating per token costs one repaint per frame, not per token)."""

    DEFAULT_CSS = """
    StatusBar { height: 2; background: $panel; color: $text-muted; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.info = StatusInfo()

    def render(self) -> Text:
        first, second = render_status(self.info, self.content_size.width or 200)
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(first, style="bold" if self.info.state in ("generating", "stopped") else "")
        text.append("\n" + second)
        return text
