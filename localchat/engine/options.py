"""Settings for loading a model (EngineOptions) and for generating a reply (Sampling).

These are what the engine takes. The user's values come from ``config.toml`` through
``localchat.settings`` (the schema) and ``engine.factory``. Each default is read from the schema's
section (``EngineSection``, ``SamplingSection``), so it has one home, for code that builds an
engine directly (tests, benches) as for the config file. Only ``n_ctx`` is the engine's own: the
schema's 0 means "the model's registry default", which only the factory knows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localchat.formats import AnswerFormat
from localchat.formats.constraint import Constraint
from localchat.settings import EngineSection, GpuLayers, KvType, SamplingSection, Speculative


@dataclass
class Sampling:
    temperature: float = SamplingSection.temperature  # 0 -> greedy
    top_p: float = SamplingSection.top_p
    top_k: int = SamplingSection.top_k
    min_p: float = SamplingSection.min_p
    repeat_penalty: float = SamplingSection.repeat_penalty
    seed: int = SamplingSection.seed  # -1 (or any negative) = random
    max_tokens: int = SamplingSection.max_tokens
    thinking: str = SamplingSection.thinking  # one of THINKING_MODES (the TUI sets it from /think)
    constraint: Constraint | None = None  # a grammar the answer must follow (per turn)
    # The same shape as the remote is asked for it (OpenAI's response_format); None: a turn
    # that has no shape, or one only the local model can give (a grammar: it stays local).
    response_format: dict[str, Any] | None = None
    # OpenAI's penalties (``localchat serve``): subtracted from the logit of each token among the
    # last 64 sampled, per occurrence and once, as llama.cpp's penalties sampler does.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # Tools the model may call this turn, as OpenAI's ``tools`` entries ({"type": "function",
    # "function": {"name", "description", "parameters"}}), rendered with the model's template;
    # ``tool_choice``: "auto", "none", "required" or a tool's name (OpenAI's meaning).
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str = "auto"
    # Each answer Token carries its log probability and this many likeliest alternatives
    # (``events.TokenLogprob``; None: not asked, and no pass over the vocabulary is made).
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def shaped(sampling: Sampling, answer_format: AnswerFormat | None) -> Sampling:
    """``sampling`` for answers in ``answer_format`` (None: answers as they come)."""
    if answer_format is None:
        return replace(sampling, constraint=None, response_format=None)
    return replace(sampling, constraint=Constraint(answer_format.grammar),
                   response_format=answer_format.response_format() if answer_format.is_json else None)


@dataclass
class EngineOptions:
    n_ctx: int = 4096
    gpu_layers: GpuLayers = EngineSection.gpu_layers
    n_batch: int = EngineSection.n_batch
    n_ubatch: int = EngineSection.n_ubatch
    n_threads: int = EngineSection.n_threads  # 0 = one per physical core
    # Sequences sharing the context's cache (``engine.slots``: serve's parallel slots).
    parallel: int = 1
    flash_attn: bool = EngineSection.flash_attn
    kv_type: KvType = EngineSection.kv_type
    # Sliding-window models (Gemma 3/4): full-size caches for the window layers reuse any prefix
    # and trim by shifting, but cost memory (Gemma-3-4B shape at n_ctx 8192: 1088 MiB of KV
    # against 334 MiB, 4352 against 814 at 32768). Off: window-size caches, rolled back through
    # checkpoints, trimmed by prefilling the kept turns in the background (README).
    swa_full: bool = EngineSection.swa_full
    # States kept at turn boundaries for models whose memory cannot drop cells (recurrent,
    # hybrid, windowed caches): rollback to the nearest one instead of prefilling from zero.
    checkpoints: int = EngineSection.checkpoints
    chat_template: str | None = EngineSection.chat_template  # a Jinja template that overrides the GGUF's
    chat_format: str | None = EngineSection.chat_format  # a named format ("chatml", "llama-3", ...) when the GGUF has none
    track_confidence: bool = False  # fill Token.prob/margin/entropy (see events.Token)
    # How many leading reply tokens carry those numbers: each costs a pass over the whole
    # vocabulary, and escalation decides within the first tokens anyway.
    confidence_tokens: int = EngineSection.confidence_tokens
    # Speculative decoding (engine/speculate.py) and the draft model it may use (a model
    # reference; the factory fills in the registry's pairing when the config names none).
    speculative: Speculative = EngineSection.speculative
    draft_model: str | None = EngineSection.draft_model
    # The model's image projector (an ``mmproj`` GGUF; the factory fills it from the registry
    # entry): loaded with the model, so messages may carry images. None: text only.
    mmproj: Path | None = None
