"""Settings for loading a model (EngineOptions) and for generating a reply (Sampling).

These are what the engine takes. The user's values come from ``config.toml`` through
``localchat.settings`` (the schema) and ``engine.factory``; the defaults here serve code that
builds an engine directly (tests, benches) and equal the schema's (tests/test_config.py checks).
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.settings import GpuLayers, KvType


@dataclass
class Sampling:
    temperature: float = 0.7  # 0 -> greedy
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int | None = None  # None = random
    max_tokens: int = 1024
    thinking: str = "auto"  # one of THINKING_MODES (the TUI sets it from /think)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class EngineOptions:
    n_ctx: int = 4096
    gpu_layers: GpuLayers = "auto"
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None  # None = let llama.cpp pick
    flash_attn: bool = False
    kv_type: KvType = "f16"
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
