"""Whether this install can read images: llama-cpp-python's image library (libmtmd) loads.

llama-cpp-python 0.3.x loads libmtmd from ``llama_cpp/lib`` when ``llama_cpp.mtmd_cpp`` is first
imported, and a build made with ``-DLLAVA_BUILD=OFF`` (localchat's default before issue 47) has
none: that import then raises. :func:`image_support` makes the import once, lazily, and turns any
failure into one line for ``doctor`` and for whatever asks for an image, never a traceback.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.models.registry import ModelSpec

REBUILD_HINT = "rebuild with scripts/test (or scripts/build-llama)"


@dataclass(frozen=True)
class ImageSupport:
    """``available``: images can be read; ``reason``: one line saying so, or why not."""

    available: bool
    reason: str

    def __str__(self) -> str:
        return f"available ({self.reason})" if self.available else f"unavailable: {self.reason}"


def load_mtmd() -> ModuleType:
    """llama-cpp-python's libmtmd bindings; importing them loads the shared library."""
    return importlib.import_module("llama_cpp.mtmd_cpp")


@functools.cache
def image_support() -> ImageSupport:
    """Probe libmtmd once per process (loading it maps ~10 MB; a second probe would learn nothing)."""
    try:
        import llama_cpp
    except ImportError as exc:
        return ImageSupport(False, f"llama-cpp-python cannot be imported ({exc})")
    try:
        load_mtmd()
    except Exception as exc:  # FileNotFoundError, OSError from ctypes, a missing symbol, ...
        from localchat.engine.gpu import has_bundled_library

        if not has_bundled_library(llama_cpp, "mtmd"):
            return ImageSupport(False, "this llama-cpp-python was built without libmtmd "
                                       f"(LLAVA_BUILD=OFF); {REBUILD_HINT}")
        return ImageSupport(False, f"libmtmd did not load ({_one_line(exc)}); {REBUILD_HINT}")
    return ImageSupport(True, "libmtmd")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def images_problem(spec: ModelSpec) -> str | None:
    """Why ``spec`` cannot read the pictures of a message, in one line; None when it can."""
    from localchat.models.registry import load_registry, local_path, projector_spec_or_none

    if not spec.reads_images:
        readers = sorted(s.name for s in load_registry().values() if s.reads_images)
        these = f"these do: {', '.join(readers)}" if readers else "no model in the registry does"
        return f"{spec.name} does not read images; {these}"
    projector = projector_spec_or_none(spec)
    if projector is not None and projector.path is not None and not projector.path.is_file():
        return (f"{spec.name}'s image projector {projector.path} is missing; import the model "
                "again with --mmproj")
    if projector is None or not local_path(projector).is_file():
        return f"{spec.name}'s image projector is not downloaded; run `localchat pull {spec.name}`"
    support = image_support()
    if not support.available:
        return f"images are {support}"
    return None
