"""Image projectors (``mmproj`` GGUF files): is a file one, and does it fit a given text model.

A projector turns an image into embeddings the text model reads as if they were tokens, so its
output width must be the text model's ``{arch}.embedding_length``; a projector made for another
model loads and then fails (or writes nonsense) at the first image. The width is read the way
llama.cpp's ``clip_n_mmproj_embd`` reads it: from the shape of the projector type's last tensor,
falling back to ``clip.vision.projection_dim`` (which converters since 2025 set to the text width;
older LLaVA converters wrote CLIP's own projection size there, hence tensors first).
"""

from __future__ import annotations

from localchat.errors import UserError
from localchat.models.gguf import GGUFInfo

# projector type -> (tensor, axis of its shape in ggml order) that holds the output width.
_WIDTH_TENSORS: dict[str, tuple[str, int]] = {
    "mlp": ("mm.2.weight", 1),
    "mlp_norm": ("mm.3.bias", 0),
    "pixtral": ("mm.2.weight", 1),
    "gemma3": ("mm.input_projection.weight", 0),
    "idefics3": ("mm.model.fc.weight", 1),
    "qwen2vl_merger": ("mm.2.bias", 0),
    "qwen25vl_merger": ("mm.2.bias", 0),
}


def is_projector(info: GGUFInfo) -> bool:
    return info.architecture == "clip" or "clip.projector_type" in info.metadata


def projector_type(info: GGUFInfo) -> str:
    kind = info.metadata.get("clip.projector_type") or info.metadata.get("clip.vision.projector_type")
    return str(kind) if kind else "mlp"  # llama.cpp's default when the key is absent (LLaVA 1.5)


def projector_width(info: GGUFInfo) -> int | None:
    """The width of the embeddings the projector writes; None when it cannot be told."""
    rule = _WIDTH_TENSORS.get(projector_type(info))
    if rule is not None:
        name, axis = rule
        tensor = next((t for t in info.tensors if t.name == name), None)
        if tensor is not None and len(tensor.shape) > axis:
            return int(tensor.shape[axis])
    width = info.metadata.get("clip.vision.projection_dim")
    return int(width) if isinstance(width, int) and width > 0 else None


def check_projector(model: GGUFInfo, projector: GGUFInfo) -> None:
    """Raise a one-line :class:`UserError` unless ``projector`` is an image projector whose output
    width is ``model``'s embedding length (a width that cannot be read on either side passes:
    llama.cpp checks again when it loads the pair)."""
    name = projector.path.name
    if not is_projector(projector):
        raise UserError(f"{name} is not an image projector (its architecture is "
                        f"{projector.architecture or 'unknown'}, not clip)")
    if is_projector(model):
        raise UserError(f"{model.path.name} is an image projector, not a model; "
                        "give the model first and the projector to --mmproj")
    width = projector_width(projector)
    if width is not None and model.embedding_length and width != model.embedding_length:
        raise UserError(f"{name} writes {width}-wide embeddings but {model.path.name} reads "
                        f"{model.embedding_length}-wide ones: it is the projector of another model")
