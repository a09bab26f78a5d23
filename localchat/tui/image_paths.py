"""Pictures named in the input: a path pasted or dropped onto the terminal (as Ollama's CLI
takes one), ``/image``'s argument as Tab completes it, and how an attached one shows as a chip.

Plain logic over text and the file system: nothing here reads a picture.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import unquote, urlparse

from localchat.attachments import complete_path, is_image_name
from localchat.store.images import ImageFile
from localchat.tui.prompt import Completion

MAX_PASTED_PATHS = 16  # a paste naming more files than this is text, whatever it says


def pasted_image_paths(text: str, cwd: Path) -> list[Path]:
    """The picture files a paste names, when naming them is all it does: one or more paths as
    terminals write a dropped file (quoted, with ``\\ `` for spaces, or as a ``file://`` URL),
    each an existing file with a picture's suffix. Anything else (prose, one path that is not
    a picture, a file that does not exist): [] and the paste is text."""
    text = text.strip()
    if not text or "\n" in text or len(text) > 8192:
        return []
    try:
        words = shlex.split(text)
    except ValueError:  # an unclosed quote: text
        return []
    if not 0 < len(words) <= MAX_PASTED_PATHS:
        return []
    paths = []
    for word in words:
        if word.startswith("file://"):
            word = unquote(urlparse(word).path)
        path = Path(word).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not is_image_name(path.name) or not path.is_file():
            return []
        paths.append(path)
    return paths


def image_path_completions(typed: str) -> list[Completion]:
    """``/image``'s argument: folders and picture files starting with ``typed``."""
    return [Completion(f"/image {path}", path) for path in complete_path(typed or "./")
            if path.endswith("/") or is_image_name(path)]


def chip(image: ImageFile, tokens: int | None) -> str:
    """``cat.png 640×480 · 576 tokens`` (the cost left out when the projector cannot tell it
    without reading the picture)."""
    ref = image.ref
    cost = f" · {tokens:,} tokens" if tokens is not None else ""
    frames = f" · GIF of {image.frames} frames: the first is read" if image.frames > 1 else ""
    return f"{ref.name} {ref.width}×{ref.height}{cost}{frames}"
