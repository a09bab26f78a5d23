"""GPU layer fitting (gpu_layers = auto) from real GGUF metadata and simulated VRAM sizes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localchat.engine import offload
from localchat.engine.offload import MiB, estimate_gpu_layers, resolve_gpu_layers
from localchat.engine.options import EngineOptions
from localchat.models.gguf import read_gguf

GiB = 1024 * MiB


@pytest.fixture(scope="module")
def smollm(test_model_path):
    return read_gguf(test_model_path)


@pytest.fixture
def llama8b(smollm):
    """Llama 3.1 8B Q4_K_M's shape: 32 layers of ~135 MB, GQA 8 KV heads of 128, 4.9 GB."""
    return replace(smollm, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, value_head_dim=128,
                   embedding_length=4096, layer_bytes=dict.fromkeys(range(32), 135 * MiB),
                   tensors=smollm.tensors)


def test_no_vram_means_no_layers(smollm):
    assert estimate_gpu_layers(smollm, 2048, "f16", 512, 0) == 0


def test_plenty_of_vram_offloads_every_layer_and_the_output_head(smollm):
    assert estimate_gpu_layers(smollm, 2048, "f16", 512, 80 * GiB) == smollm.n_layers + 1


def test_more_free_vram_never_fits_fewer_layers(llama8b):
    counts = [estimate_gpu_layers(llama8b, 8192, "f16", 512, gib * GiB) for gib in range(1, 12)]
    assert counts == sorted(counts)
    assert counts[0] <= 1 and counts[-1] == 33


def test_a_laptop_gpu_gets_a_partial_offload(llama8b):
    layers = estimate_gpu_layers(llama8b, 8192, "f16", 512, 4 * GiB)
    assert 10 < layers < 32


def test_a_quantized_kv_cache_leaves_room_for_more_layers(llama8b):
    f16 = estimate_gpu_layers(llama8b, 32768, "f16", 512, 6 * GiB)
    q8 = estimate_gpu_layers(llama8b, 32768, "q8_0", 512, 6 * GiB)
    q4 = estimate_gpu_layers(llama8b, 32768, "q4_0", 512, 6 * GiB)
    assert f16 < q8 < q4


def test_a_longer_context_fits_fewer_layers(llama8b):
    short = estimate_gpu_layers(llama8b, 4096, "f16", 512, 6 * GiB)
    long = estimate_gpu_layers(llama8b, 65536, "f16", 512, 6 * GiB)
    assert long < short


def test_cpu_only_build_offloads_nothing_and_says_why(smollm, monkeypatch):
    monkeypatch.setattr(offload, "gpu_backend", lambda: ("CPU", "no GPU backend in this build"))
    plan = resolve_gpu_layers("auto", smollm, EngineOptions())
    assert (plan.n_gpu_layers, plan.backend) == (0, "CPU") and "no GPU backend" in plan.reason


def test_cuda_auto_uses_free_vram(llama8b, monkeypatch):
    monkeypatch.setattr(offload, "gpu_backend", lambda: ("CUDA", "CUDA backend"))
    monkeypatch.setattr(offload, "free_vram_bytes", lambda: 4 * GiB)
    plan = resolve_gpu_layers("auto", llama8b, EngineOptions(n_ctx=8192))
    assert plan.backend == "CUDA" and 0 < plan.offloaded_layers < 32 and "4096 MiB" in plan.reason


def test_metal_takes_every_layer(smollm, monkeypatch):
    monkeypatch.setattr(offload, "gpu_backend", lambda: ("Metal", "Metal backend"))
    plan = resolve_gpu_layers("auto", smollm, EngineOptions())
    assert plan.n_gpu_layers == smollm.n_layers + 1 and plan.offloaded_layers == smollm.n_layers


@pytest.mark.parametrize("setting, expected", [("all", 31), (12, 12), ("7", 7), (0, 0), (999, 31)])
def test_explicit_settings_are_honoured(smollm, monkeypatch, setting, expected):
    monkeypatch.setattr(offload, "gpu_backend", lambda: ("CUDA", "CUDA backend"))
    assert resolve_gpu_layers(setting, smollm, EngineOptions()).n_gpu_layers == expected


def test_unknown_free_vram_keeps_the_model_on_the_cpu_and_says_what_to_set(smollm, monkeypatch):
    monkeypatch.setattr(offload, "gpu_backend", lambda: ("Vulkan", "Vulkan backend"))
    monkeypatch.setattr(offload, "free_vram_bytes", lambda: None)
    plan = resolve_gpu_layers("auto", smollm, EngineOptions())
    assert plan.n_gpu_layers == 0 and "gpu_layers = N" in plan.reason


def test_bad_setting_is_a_clear_error(smollm, monkeypatch):
    from localchat.errors import EngineError

    monkeypatch.setattr(offload, "gpu_backend", lambda: ("CUDA", "CUDA backend"))
    with pytest.raises(EngineError, match="auto, all or a number"):
        resolve_gpu_layers("lots", smollm, EngineOptions())
