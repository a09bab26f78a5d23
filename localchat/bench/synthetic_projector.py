"""Tiny synthetic image projectors: ``mlp`` (LLaVA-1.5 layout) clip GGUFs written with gguf-py, for
``bench --images`` and the tests (no real vision model can be downloaded where they run).

Its vision tower is a toy (28-pixel images, 2x2 patches of 14, one block, width 32) with random
weights; what the tests read is its metadata and the shape of ``mm.2.weight``, whose rows are the
projector's output width: 576 by default, SmolLM2-135M's embedding length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _mlp_writer(path: Path, name: str, *, width: int, hidden: int, image_size: int,
                patch_size: int, blocks: int) -> Any:
    """A clip GGUF writer with an ``mlp`` projector's header (its tensors and normalization are
    the caller's)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", name)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_text_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", hidden)
    writer.add_uint32("clip.vision.feed_forward_length", hidden * 2)
    writer.add_uint32("clip.vision.block_count", blocks)
    writer.add_uint32("clip.vision.attention.head_count", 2)
    writer.add_uint32("clip.vision.projection_dim", width)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    return writer


def write_mlp_projector(path: Path, *, width: int = 576, hidden: int = 32, image_size: int = 28,
                        patch_size: int = 14, blocks: int = 1) -> Path:

    writer = _mlp_writer(path, "synthetic mlp projector", width=width, hidden=hidden,
                         image_size=image_size, patch_size=patch_size, blocks=blocks)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        # numpy order: the last axis is ggml's ne[0] (so mm.2.weight is (width, hidden) here).
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    positions = (image_size // patch_size) ** 2 + 1  # the patches and the class embedding
    tensor("v.class_embd", hidden)
    tensor("v.patch_embd.weight", hidden, 3, patch_size, patch_size)
    tensor("v.position_embd.weight", positions, hidden)
    tensor("v.pre_ln.weight", hidden)
    tensor("v.pre_ln.bias", hidden)
    for n in range(blocks):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"v.blk.{n}.{part}.weight", hidden, hidden)
            tensor(f"v.blk.{n}.{part}.bias", hidden)
        for norm in ("ln1", "ln2"):
            tensor(f"v.blk.{n}.{norm}.weight", hidden)
            tensor(f"v.blk.{n}.{norm}.bias", hidden)
        tensor(f"v.blk.{n}.ffn_up.weight", hidden * 2, hidden)
        tensor(f"v.blk.{n}.ffn_up.bias", hidden * 2)
        tensor(f"v.blk.{n}.ffn_down.weight", hidden, hidden * 2)
        tensor(f"v.blk.{n}.ffn_down.bias", hidden)
    tensor("mm.0.weight", width, hidden)
    tensor("mm.0.bias", width)
    tensor("mm.2.weight", width, width)
    tensor("mm.2.bias", width)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def token_embeddings(model: Path, token_ids: list[int]) -> np.ndarray:
    """Rows of ``model``'s input embedding table, dequantized to float32 as llama.cpp reads them."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    table = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return np.asarray(gguf.quants.dequantize(table.data[token_ids], table.tensor_type),
                      dtype=np.float32).reshape(len(token_ids), -1)


def write_colour_projector(path: Path, words: np.ndarray, *, hidden: int = 32,
                           image_size: int = 28, patch_size: int = 14) -> Path:
    """An ``mlp`` projector that reads each patch's colour as a word: a patch of pure red, green
    or blue becomes exactly ``words[0]``, ``[1]`` or ``[2]`` (the text model's own input
    embeddings of three colour words), so a solid red picture reads as " red red ... red".

    How: pixels are not normalized (mean 0, std 1); the patch embedding copies the patch's
    centre pixel (weights 1/4 on its 2x2 centre: exact in f16) into hidden dims 0-2; no layer
    runs (llava uses the second-to-last of one block), no pre-norm, no class token; ``mm.0`` maps a
    channel at 1.0 to 16 and at 0.0 to -16, where ggml's GELU is exactly x and 0; ``mm.2``
    scales unit k by ``words[k] / 16`` (a power of two: exact). Use square pictures of
    ``image_size`` pixels: llava pads others to a square with black."""

    width = words.shape[1]
    writer = _mlp_writer(path, "synthetic colour-words projector", width=width, hidden=hidden,
                         image_size=image_size, patch_size=patch_size, blocks=1)
    writer.add_array("clip.vision.image_mean", [0.0, 0.0, 0.0])
    writer.add_array("clip.vision.image_std", [1.0, 1.0, 1.0])

    def tensor(name: str, value: np.ndarray) -> None:
        writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))

    patch = np.zeros((hidden, 3, patch_size, patch_size), np.float32)
    mid = patch_size // 2
    for c in range(3):
        patch[c, c, mid - 1:mid + 1, mid - 1:mid + 1] = 0.25
    # No class embedding: this llama.cpp appends it after the patches but picks the rows from
    # 1 on, as if it came first, so one patch would read as the class token.
    positions = (image_size // patch_size) ** 2
    tensor("v.patch_embd.weight", patch)
    tensor("v.position_embd.weight", np.zeros((positions, hidden)))
    for part in ("attn_q", "attn_k", "attn_v", "attn_out"):  # present, never run
        tensor(f"v.blk.0.{part}.weight", np.zeros((hidden, hidden)))
        tensor(f"v.blk.0.{part}.bias", np.zeros(hidden))
    for norm in ("ln1", "ln2"):
        tensor(f"v.blk.0.{norm}.weight", np.ones(hidden))
        tensor(f"v.blk.0.{norm}.bias", np.zeros(hidden))
    tensor("v.blk.0.ffn_up.weight", np.zeros((hidden * 2, hidden)))
    tensor("v.blk.0.ffn_up.bias", np.zeros(hidden * 2))
    tensor("v.blk.0.ffn_down.weight", np.zeros((hidden, hidden * 2)))
    tensor("v.blk.0.ffn_down.bias", np.zeros(hidden))
    mm0 = np.zeros((width, hidden), np.float32)
    for k in range(3):
        mm0[k, k] = 32.0
    tensor("mm.0.weight", mm0)
    tensor("mm.0.bias", np.full(width, -16.0))
    mm2 = np.zeros((width, width), np.float32)
    for k in range(3):
        mm2[:, k] = words[k] / 16.0
    tensor("mm.2.weight", mm2)
    tensor("mm.2.bias", np.zeros(width))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
