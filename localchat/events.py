"""The one event vocabulary that the local engine and the remote client emit, and that the TUI,
``ask`` and ``bench`` consume.

A turn produces, in order: zero or more ``PrefillProgress``, zero or more ``Thinking`` (a reasoning
model's chain of thought) and ``Token`` (the answer), and exactly one final ``Done`` (finish_reason "stop", "length" or "aborted") or ``Failed``. ``Notice`` may
appear anywhere. Model loading produces ``LoadProgress`` then ``Loaded`` or ``Failed``.

Timing field names follow llama.cpp's server (``cache_n``, ``prompt_n``, ``prompt_ms``,
``predicted_n``, ``predicted_ms``) so numbers can be compared with it directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from localchat.reasoning import split_reply

FinishReason = Literal["stop", "length", "aborted"]


@dataclass
class Timings:
    """What one turn cost. Times in milliseconds."""

    cache_n: int = 0  # tokens reused from the KV cache
    prompt_n: int = 0  # tokens prefilled this turn
    prompt_ms: float = 0.0
    predicted_n: int = 0  # tokens generated
    predicted_ms: float = 0.0
    ttft_ms: float = 0.0  # turn submitted -> first token text available (reasoning or answer)
    time_to_answer_ms: float = 0.0  # turn submitted -> first answer text (0: no answer came)
    thinking_n: int = 0  # of predicted_n, tokens spent reasoning (remote: reasoning chunks)
    tpot_ms: float = 0.0  # mean decode time per token after the first
    # Inter-token latency: percentiles (localchat.percentiles) of the gaps between consecutive
    # reply tokens as they arrive (remote: streamed chunks, one token each), on either route.
    itl_p50_ms: float = 0.0
    itl_p95_ms: float = 0.0
    n_ctx: int = 0
    n_ctx_used: int = 0  # tokens in the KV cache when the turn ended
    # The chat template rewrote earlier turns, so reuse fell back to the longest common prefix.
    prefix_fallback: bool = False
    # Context management (issue: context that never overflows).
    trimmed_n: int = 0  # tokens removed from the KV cache this turn
    summary_n: int = 0  # tokens of running summary in context
    context_shift: bool = False  # trimmed by shifting KV positions (no re-prefill)
    # Cells in use that a context shift made approximate (they serve this conversation only).
    approx_n: int = 0
    restore_ms: float = 0.0  # time to restore a saved KV snapshot before this turn
    # Prompt tokens evaluated again although the cache held them (a checkpoint rollback, a trim
    # on a memory that cannot drop turns, a changed system prompt or summary before them) ...
    rebuild_n: int = 0
    # ... and what such rebuilding cost in the background since the previous turn.
    rebuild_background_n: int = 0
    rebuild_background_ms: float = 0.0
    route: str = "local"  # "local" or "remote"
    route_reason: str = ""
    model: str = ""

    @property
    def rebuild(self) -> bool:
        return self.rebuild_n > 0 or self.rebuild_background_n > 0

    @property
    def predicted_per_second(self) -> float:
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    @property
    def prompt_per_second(self) -> float:
        return 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["predicted_per_second"] = round(self.predicted_per_second, 2)
        d["prompt_per_second"] = round(self.prompt_per_second, 2)
        d["rebuild"] = self.rebuild
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3)
        return d


@dataclass(frozen=True)
class LoadProgress:
    fraction: float  # 0.0 .. 1.0


@dataclass(frozen=True)
class Loaded:
    model: str
    n_ctx: int
    gpu_layers: int  # layers offloaded
    n_layers: int
    backend: str  # "CPU", "CUDA", "Metal", ...
    load_ms: float = 0.0
    memory: str = "kv"  # kv | swa | recurrent | hybrid (engine/runtime.memory_kind)


@dataclass(frozen=True)
class PrefillProgress:
    done: int  # prompt tokens evaluated so far this turn
    total: int  # prompt tokens to evaluate this turn


@dataclass(frozen=True)
class Token:
    text: str  # may be "" when a token ends inside a multi-byte character
    token_id: int = -1
    # Only when confidence tracking is on, and only for the reply's first
    # EngineOptions.confidence_tokens tokens: the probability the model gave the sampled token,
    # the top-1 minus top-2 probability, and the entropy (nats) of the next-token distribution.
    prob: float | None = None
    margin: float | None = None
    entropy: float | None = None


@dataclass(frozen=True)
class Thinking:
    """Reasoning text, streamed before the answer; never part of the answer's Tokens."""

    text: str


@dataclass(frozen=True)
class Done:
    reply: str  # as the model wrote it, reasoning included: what the history keeps
    finish_reason: FinishReason
    timings: Timings = field(default_factory=Timings)
    thinking: str = ""  # the reasoning part of ``reply``, as streamed in Thinking events

    @property
    def answer(self) -> str:
        """The reply without its reasoning."""
        if not self.thinking:
            return self.reply
        reasoning, answer = split_reply(self.reply)
        # No closing tag: the reply stopped while still reasoning inside a block the prompt opened.
        return answer if reasoning else ""


@dataclass(frozen=True)
class Failed:
    message: str  # one line, written for the user


@dataclass(frozen=True)
class Notice:
    message: str  # one line, written for the user (a fall-back, a trim, a breaker state)
    kind: str = "info"


Event = LoadProgress | Loaded | PrefillProgress | Thinking | Token | Done | Failed | Notice
