"""Whether a model reads images here, asked before anything loads (``ask --image``, the app's
``/image``): its registry entry has a projector, the projector is downloaded, and this llama.cpp
build can read images. Each no is one line naming what to do (the models that read images, the
pull that fetches a projector).

For the app's chip, what one picture will cost in tokens, when the projector's header says it
without decoding anything: a fixed-grid projector (``mlp``, LLaVA-1.5's layout) always makes
``(image_size / patch_size)²`` tokens; others depend on the picture (tiles, native resolution),
and their cost is left unsaid rather than guessed.
"""

from __future__ import annotations

from localchat.errors import UserError


class ImagesRefused(UserError):
    """Pictures that cannot go where asked (the model reads none, or they cannot go there)."""

    exit_code = 2


def check_model(model: str | None) -> int | None:
    """ImagesRefused unless ``model`` (None: the configured default) reads images here; else the
    tokens one picture takes, when the projector's header tells it (None when it does not)."""
    from localchat.engine.vision import images_problem
    from localchat.models.registry import local_path, projector_spec_or_none, resolve_model

    spec = resolve_model(model)
    problem = images_problem(spec)
    if problem:
        raise ImagesRefused(problem)
    projector = projector_spec_or_none(spec)
    assert projector is not None  # images_problem said it is there
    return tokens_per_image(local_path(projector))


def tokens_per_image(projector_file: object) -> int | None:
    """A fixed-grid projector's tokens per picture, from its header; None for any other."""
    from pathlib import Path

    from localchat.models.gguf import read_gguf
    from localchat.models.projector import projector_type

    try:
        info = read_gguf(Path(str(projector_file)))
    except UserError:
        return None
    size = info.metadata.get("clip.vision.image_size")
    patch = info.metadata.get("clip.vision.patch_size")
    if projector_type(info) != "mlp" or not isinstance(size, int) or not isinstance(patch, int) \
            or patch <= 0:
        return None
    return (size // patch) ** 2
