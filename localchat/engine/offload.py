"""How many layers to put on the GPU.

``gpu_layers = "auto"`` fills free VRAM the way Ollama's estimator does: per-layer weight bytes
from the GGUF's tensors (``blk.N.*``), plus each layer's share of the KV cache for the chosen
``n_ctx`` and KV type, after reserving the compute graph and a safety margin. Apple's Metal shares
system memory, so it takes every layer; a build without a GPU backend takes none and says why.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from localchat.engine.options import EngineOptions
from localchat.errors import EngineError
from localchat.models.gguf import GGUFInfo

MiB = 1024 * 1024
# Bytes per KV element for each cache type (q8_0: 34 bytes per 32 values; q4_0: 18 per 32).
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
# Kept free on the GPU for the driver, other programs and estimate error.
SAFETY_MARGIN_BYTES = 512 * MiB
SAFETY_MARGIN_FRACTION = 0.05


@dataclass(frozen=True)
class OffloadPlan:
    n_gpu_layers: int  # the value given to llama.cpp (n_layers + 1 also offloads the output head)
    offloaded_layers: int  # repeating layers on the GPU, for display ("GPU 28/28")
    n_layers: int
    backend: str  # "CPU", "CUDA", "Metal", "Vulkan", ...
    reason: str  # why this number (shown by doctor and the status bar's tooltip)


def graph_reserve_bytes(gguf: GGUFInfo, n_ubatch: int, n_ctx: int) -> int:
    """Compute-buffer estimate: logits and activations for one micro-batch plus attention scores."""
    n_embd = gguf.embedding_length or 4096
    n_vocab = _vocab_size(gguf)
    n_heads = gguf.n_heads or 32
    activations = n_ubatch * (n_vocab + 8 * n_embd) * 4
    attention = n_ubatch * n_ctx * n_heads * 4 // 4  # flash-attn-less scores, one layer at a time
    return max(256 * MiB, activations + attention)


def estimated_gpu_bytes(gguf: GGUFInfo, layers: int, output: bool, n_ctx: int, kv_type: str,
                        n_ubatch: int, swa_full: bool = False) -> int:
    """What ``estimate_gpu_layers`` counts on a device for ``layers`` repeating layers (plus the
    output head with ``output``): their weights, their share of the KV cache, the compute graph.
    Compared with what llama.cpp really allocates by scripts/gpu-check and the tests."""
    n_layers = gguf.n_layers or 0
    if n_layers == 0 or layers <= 0:
        return 0
    kv_total = gguf.kv_cache_bytes(n_ctx, KV_BYTES_PER_ELEMENT.get(kv_type, 2.0),
                                   swa_full=swa_full, n_ubatch=n_ubatch)
    weights = sum(gguf.layer_bytes.get(layer, 0) for layer in range(min(layers, n_layers)))
    return (weights + kv_total * min(layers, n_layers) // n_layers
            + (gguf.non_layer_bytes if output else 0) + graph_reserve_bytes(gguf, n_ubatch, n_ctx))


def estimate_gpu_layers(gguf: GGUFInfo, n_ctx: int, kv_type: str, n_ubatch: int, free_bytes: int,
                        swa_full: bool = False, reserve_bytes: int = 0) -> int:
    """Layers (0..n_layers+1) that fit in ``free_bytes`` of VRAM, ``reserve_bytes`` of it kept
    for something else (a draft model, loaded next)."""
    n_layers = gguf.n_layers or 0
    if n_layers == 0 or free_bytes <= 0:
        return 0
    kv_total = gguf.kv_cache_bytes(n_ctx, KV_BYTES_PER_ELEMENT.get(kv_type, 2.0),
                                   swa_full=swa_full, n_ubatch=n_ubatch)
    kv_per_layer = kv_total // n_layers
    margin = max(SAFETY_MARGIN_BYTES, int(free_bytes * SAFETY_MARGIN_FRACTION))
    budget = free_bytes - margin - graph_reserve_bytes(gguf, n_ubatch, n_ctx) - reserve_bytes
    for layer in range(n_layers):
        cost = gguf.layer_bytes.get(layer, 0) + kv_per_layer
        if cost > budget:
            return layer  # layers 0..layer-1 fit
        budget -= cost
    # The output head (embeddings/output tensors) goes last; llama.cpp counts it as one more layer.
    return n_layers + 1 if gguf.non_layer_bytes <= budget else n_layers


def resolve_gpu_layers(setting: str | int, gguf: GGUFInfo, options: EngineOptions,
                       reserve_bytes: int = 0) -> OffloadPlan:
    """Turn the ``gpu_layers`` setting ("auto" | "all" | N | 0) into a plan for this machine;
    "auto" leaves ``reserve_bytes`` of VRAM free (the draft model's, ``draft_model.plan_draft``)."""
    n_layers = gguf.n_layers or 0
    backend, reason = gpu_backend()
    if isinstance(setting, str) and setting not in ("auto", "all"):
        try:
            setting = int(setting)
        except ValueError:
            raise EngineError(f"gpu_layers must be auto, all or a number, not {setting!r}") from None
    if backend == "CPU":
        return OffloadPlan(0, 0, n_layers, "CPU", reason)
    if setting == "all" or (setting == "auto" and backend == "Metal"):
        why = "Metal shares system memory" if setting == "auto" else "gpu_layers = all"
        return OffloadPlan(n_layers + 1, n_layers, n_layers, backend, why)
    if isinstance(setting, int):
        count = max(0, min(setting, n_layers + 1))
        return OffloadPlan(count, min(count, n_layers), n_layers, backend if count else "CPU",
                           f"gpu_layers = {setting}")
    free = free_vram_bytes()
    if free is None:
        return OffloadPlan(0, 0, n_layers, "CPU",
                           f"{backend} is available but free VRAM is unknown; set gpu_layers = N")
    # Parallel slots hold n_ctx cells each (``engine.slots``).
    count = estimate_gpu_layers(gguf, options.n_ctx * max(1, options.parallel), options.kv_type,
                                options.n_ubatch, free,
                                options.swa_full, reserve_bytes)
    why = f"auto: {count} of {n_layers + 1} layers fit in {free // MiB} MiB free VRAM"
    if reserve_bytes:
        why += f" ({reserve_bytes // MiB} MiB kept for the draft model)"
    return OffloadPlan(count, min(count, n_layers), n_layers, backend if count else "CPU", why)


def gpu_backend() -> tuple[str, str]:
    """("CUDA" | "Metal" | "Vulkan" | "GPU" | "CPU", reason) for this llama-cpp-python build."""
    from localchat.engine.gpu import backend_info

    info = backend_info()
    if not info.gpu_offload:
        return "CPU", info.offload_problem or "this llama.cpp build has no GPU backend"
    if info.backend == "Metal" or sys.platform == "darwin":
        return "Metal", "Metal backend"
    return info.backend or "GPU", f"{info.backend or 'GPU'} backend"


def free_vram_bytes() -> int | None:
    """Free memory of the first GPU: nvidia-smi's figure, else what llama.cpp's GPU device
    reports (Vulkan, Metal); None when unknown."""
    from localchat.engine.gpu import backend_info, detect_gpus

    gpus = detect_gpus()
    if gpus:
        return gpus[0].free_mib * MiB
    devices = [d for d in backend_info().devices if d.kind in ("gpu", "igpu") and d.free_mib > 0]
    return devices[0].free_mib * MiB if devices else None


def _vocab_size(gguf: GGUFInfo) -> int:
    for tensor in gguf.tensors:
        if tensor.name in ("output.weight", "token_embd.weight") and len(tensor.shape) >= 2:
            return max(tensor.shape)
    return 32000
