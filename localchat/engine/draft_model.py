"""The draft model: a small second model with the target's vocabulary that proposes the next few
tokens, one cheap decode each, for the target to check in one batch (``speculate``, ``verify``).

Its KV cache follows the target's exact record: before drafting it holds the conversation's
tokens as the record has them (history and reply so far), reached from what it held by their
longest common prefix, so a turn adds only the new messages, as the target's cache does, and the
drafted tokens the target rejected are dropped by the next draft's sync. Its cells need not be
exact (a draft is only a proposal: the target decides every token), but they are, except after
a trim: then the sync prefills from the first cell that moved.

Refused at load, each in one line naming both models (the chat goes on without it): another
vocabulary, a memory that cannot drop cells, a model that does not fit next to the target (in
VRAM, where the offload plan kept room for it, or in RAM).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from localchat.engine.ngram import TokenLog
from localchat.engine.offload import (
    KV_BYTES_PER_ELEMENT,
    MiB,
    estimated_gpu_bytes,
    gpu_backend,
    resolve_gpu_layers,
)
from localchat.engine.options import EngineOptions
from localchat.engine.runtime import DecodeAborted, LlamaRuntime
from localchat.errors import EngineError, UserError
from localchat.models.gguf import GGUFInfo, read_gguf

# Drafting stops at a token the draft model is less sure of than this: its later tokens would
# mostly be rejected, and each costs a draft decode and a slot in the target's batch (llama.cpp's
# speculative example uses the same cut, --draft-p-min 0.75).
P_MIN = 0.75
# Models of one family pad their embedding tables differently (Qwen2.5 0.5B: 151,936 rows, 7B:
# 152,064); llama.cpp's speculative decoding allows this much difference. More is accepted only
# where every extra token is marked unused (scripts/synth-gguf pads the test model's tokenizer
# so to an 8B model's 128,256 tokens).
VOCAB_SIZE_SLACK = 128
# Token texts compared at load: all the special ones at the start, then evenly spread ids.
VOCAB_SAMPLE = 4096
# Prompt tokens per decode when the draft catches up with the conversation.
CATCH_UP_CHUNK = 128


@dataclass(frozen=True)
class DraftPlan:
    """The draft model a load is to use, before any weights load: its file, header and what it
    needs on the GPU (the target's offload plan keeps that free)."""

    name: str
    path: Path
    gguf: GGUFInfo
    gpu_bytes: int  # every layer and its KV cache on the GPU; 0 on a CPU-only build


def plan_draft(ref: str, options: EngineOptions, target_name: str) -> DraftPlan:
    """Resolve the draft model ``ref`` (registry name, hf: reference or path) for a target loaded
    with ``options``; EngineError naming both models when it cannot be used."""
    from localchat.models.registry import require_local, resolve_model

    try:
        spec = resolve_model(ref)
        path = require_local(spec)
        gguf = read_gguf(path)
        gguf.require_complete()
    except UserError as exc:
        raise EngineError(f"draft model {ref} for {target_name} cannot be used: {exc}") from None
    if gguf.memory_kind in ("recurrent", "hybrid"):
        raise EngineError(f"draft model {spec.name} for {target_name} has a {gguf.memory_kind} "
                          "memory, which cannot drop the drafts the target rejects")
    backend, _ = gpu_backend()
    gpu = 0
    if backend != "CPU" and options.gpu_layers != 0:
        gpu = estimated_gpu_bytes(gguf, gguf.n_layers or 0, True, options.n_ctx, options.kv_type,
                                  options.n_ubatch)
    return DraftPlan(spec.name, path, gguf, gpu)


def load_draft(plan: DraftPlan, options: EngineOptions, target: LlamaRuntime,
               target_name: str) -> DraftModel:
    """Load ``plan``'s model next to the loaded ``target`` (its context size, KV type and
    threads), entirely on the GPU when the target's backend has one, else on the CPU.
    EngineError, in one line naming both models, when it does not fit or does not match."""
    both = f"draft model {plan.name} for {target_name}"
    draft_options = replace(options, n_ctx=target.n_ctx, swa_full=True, draft_model=None,
                            speculative="off")
    n_gpu_layers = 0
    if plan.gpu_bytes:
        fit = resolve_gpu_layers("auto", plan.gguf, draft_options)
        n_layers = plan.gguf.n_layers or 0
        if fit.n_gpu_layers <= n_layers:  # a draft split across devices is slower than none
            raise EngineError(f"{both} does not fit in free VRAM next to it (needs about "
                              f"{plan.gpu_bytes // MiB} MiB: {fit.reason})")
        n_gpu_layers = fit.n_gpu_layers
    else:
        problem = _ram_problem(plan.gguf, draft_options)
        if problem:
            raise EngineError(f"{both} does not fit in memory: {problem}")
    runtime = LlamaRuntime(plan.path, draft_options, n_gpu_layers)
    try:
        problem = vocabulary_problem(target, runtime)
        if problem:
            raise EngineError(f"{both} has another vocabulary ({problem}); a draft model must "
                              "share its target's tokenizer")
        if runtime.needs_checkpoints:
            raise EngineError(f"{both} has a {runtime.memory_kind} memory, which cannot drop "
                              "the drafts the target rejects")
    except EngineError:
        runtime.close()
        raise
    return DraftModel(runtime, plan.name, min(target.n_vocab, runtime.n_vocab))


def vocabulary_problem(target: LlamaRuntime, draft: LlamaRuntime) -> str | None:
    """Why ``draft`` cannot propose tokens for ``target`` (their ids would mean other text), or
    None: the sizes within VOCAB_SIZE_SLACK (or the larger one's extra tokens unused), the same
    BOS/EOS, the same text for a sample of ids (every special one at the start, then spread over
    the shared range)."""
    larger = target if target.n_vocab >= draft.n_vocab else draft
    shared = min(target.n_vocab, draft.n_vocab)
    extra = range(shared, larger.n_vocab)
    lib = target._lib
    if len(extra) > VOCAB_SIZE_SLACK and not all(
            lib.llama_vocab_get_attr(larger.vocab, token) & lib.LLAMA_TOKEN_ATTR_UNUSED
            for token in _spread(extra)):
        return f"{draft.n_vocab} tokens against {target.n_vocab}"
    if target.bos_id != draft.bos_id or target.model.token_eos() != draft.model.token_eos():
        return "other begin/end-of-text tokens"
    ids = sorted(set(range(min(shared, 512))) | set(_spread(range(shared))))
    text = lib.llama_vocab_get_text
    for token in ids:
        if text(target.vocab, token) != text(draft.vocab, token):
            return f"token {token} differs"
    return None


def _spread(ids: range) -> list[int]:
    """About VOCAB_SAMPLE ids spread evenly over ``ids``, its last one included."""
    step = max(1, len(ids) // VOCAB_SAMPLE)
    return [*ids[::step], ids[-1]] if ids else []


def _ram_problem(gguf: GGUFInfo, options: EngineOptions) -> str | None:
    """Why the draft's weights and KV cache would not fit in the memory free now, or None."""
    available = _available_ram()
    if available is None:
        return None
    kv = gguf.kv_cache_bytes(options.n_ctx, KV_BYTES_PER_ELEMENT.get(options.kv_type, 2.0))
    needed = gguf.file_size + kv
    if needed > available:
        return f"it needs about {needed // MiB} MiB and {available // MiB} MiB are free"
    return None


def _available_ram() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class DraftModel:
    """A loaded draft model and the tokens its cache holds (engine thread only)."""

    def __init__(self, runtime: LlamaRuntime, name: str, n_shared: int) -> None:
        self.runtime = runtime
        self.name = name
        self._n_shared = n_shared  # ids both vocabularies have: drafts stay below them
        self._held = np.zeros(runtime.n_ctx, dtype=np.int32)
        self._n_held = 0

    def propose(self, log: TokenLog, limit: int,
                should_stop: Callable[[], bool]) -> tuple[list[int], float]:
        """Up to ``limit`` tokens the draft model expects after ``log`` (greedy, each at least
        P_MIN likely), and the ms it took. Empty when a stop came or the context is full."""
        started = time.perf_counter()
        tokens = _text_only(log.tokens)
        n = len(tokens)
        limit = min(limit, self.runtime.n_ctx - n - 1)
        draft: list[int] = []
        try:
            if limit <= 0 or not self._catch_up(tokens, should_stop):
                return [], 0.0
            runtime = self.runtime
            while True:
                logits = runtime.last_logits()[:self._n_shared]
                token = int(np.argmax(logits))
                top = logits[token]
                if (1.0 / float(np.exp(logits - top).sum()) < P_MIN
                        or runtime.is_end_of_generation(token)):
                    break
                draft.append(token)
                if len(draft) >= limit or should_stop():
                    break
                runtime.decode([token], self._n_held)
                self._hold([token])
        except EngineError:  # its own context failed: no draft now, a clean cache next time
            self.forget()
        return draft, (time.perf_counter() - started) * 1000.0

    def _catch_up(self, tokens: np.ndarray, should_stop: Callable[[], bool]) -> bool:
        """Bring the cache to hold exactly ``tokens`` with the logits after the last one: keep
        the longest common prefix (less the last token, whose logits are needed), drop the rest
        (the drafts the target rejected), evaluate what is missing. False if a stop ended it."""
        n = len(tokens)
        m = min(self._n_held, n - 1)
        differ = np.flatnonzero(self._held[:m] != tokens[:m])
        common = int(differ[0]) if differ.size else m
        if common < self._n_held:
            if not self.runtime.remove(common, -1):
                self.forget()
                common = 0
            self._n_held = common
        pending = tokens[common:].tolist()
        unknown = next((i for i, t in enumerate(pending) if t >= self._n_shared), None)
        if unknown is not None:  # the target wrote a token this model does not have
            pending = pending[:unknown]
        try:
            for start in range(0, len(pending), CATCH_UP_CHUNK):
                if should_stop():
                    return False
                chunk = pending[start:start + CATCH_UP_CHUNK]
                self.runtime.decode(chunk, self._n_held, abortable=True)
                self._hold(chunk)
        except DecodeAborted:
            return False
        return unknown is None

    def _hold(self, tokens: list[int]) -> None:
        self._held[self._n_held:self._n_held + len(tokens)] = tokens
        self._n_held += len(tokens)

    def forget(self) -> None:
        """Empty its cache (the next draft prefills the whole conversation again)."""
        self.runtime.clear()
        self._n_held = 0

    def close(self) -> None:
        self.runtime.close()


def _text_only(tokens: np.ndarray) -> np.ndarray:
    """``tokens`` without a picture's placeholder cells (negative ids): the draft model has no
    projector, so it reads the conversation's text around the pictures (the target checks its
    guesses all the same)."""
    return tokens[tokens >= 0] if (tokens < 0).any() else tokens
