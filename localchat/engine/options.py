"""Settings for loading a model (EngineOptions) and for generating a reply (Sampling)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

THINKING_MODES = ("auto", "on", "off")


@dataclass
class Sampling:
    temperature: float = 0.7  # 0 -> greedy
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int | None = None
    max_tokens: int = 512
    # "auto" | "on" | "off": enable_thinking for templates that take it (Qwen3 style).
    thinking: str = "auto"

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class EngineOptions:
    n_ctx: int = 4096
    gpu_layers: str | int = "auto"  # "auto" | "all" | N | 0
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    flash_attn: bool = False
    kv_type: str = "f16"  # f16 | q8_0 | q4_0
    # Sliding-window models (Gemma 3/4): full-size caches for the window layers reuse any prefix
    # and trim by shifting, but cost memory (Gemma-3-4B shape at n_ctx 8192: 1088 MiB of KV
    # against 334 MiB, 4352 against 814 at 32768). Off: window-size caches, rolled back through
    # checkpoints, trimmed by prefilling the kept turns in the background (README).
    swa_full: bool = False
    # States kept at turn boundaries for models whose memory cannot drop cells (recurrent,
    # hybrid, windowed caches): rollback to the nearest one instead of prefilling from zero.
    checkpoints: int = 8
    chat_template: str | None = None  # a Jinja template that overrides the GGUF's
    chat_format: str | None = None  # a named format ("chatml", "llama-3", ...) when the GGUF has none
    track_confidence: bool = False  # fill Token.prob/margin/entropy (see events.Token)
    # How many leading reply tokens carry those numbers: each costs a pass over the whole
    # vocabulary, and escalation decides within the first tokens anyway.
    confidence_tokens: int = 32


def merged(cls: type, *layers: dict[str, Any] | None) -> Any:
    """Build ``cls`` from dict layers (later layers win), ignoring None values and unknown keys."""
    names = {f.name for f in fields(cls)}
    values: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if key in names and value is not None:
                values[key] = value
    return cls(**values)
