"""The ``digest`` Ollama's listings give each model (``/api/tags``, ``/api/ps``): the sha256 of its
GGUF file, which clients compare to tell whether a model changed.

The registry's own ``sha256`` is used when it has one (pull checked the file against it).
Otherwise the file is hashed once and the digest kept for as long as its (path, size, mtime) stay
the same: hashing a multi-GB file takes seconds (~1.5 GB/s), so never per request. A file is
hashed by one thread at a time however many requests ask; the routes ask off the event loop.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from localchat.serve.model_host import ServedModel

_CHUNK = 4 * 1024 * 1024

_Key = tuple[str, int, int]  # path, size, mtime in ns
_known: dict[_Key, str] = {}
_hashing: dict[_Key, threading.Lock] = {}
_guard = threading.Lock()


def digest_of(model: ServedModel) -> str:
    """The sha256 (hex) of ``model``'s file ("" when the file cannot be read)."""
    if model.spec.sha256:
        return model.spec.sha256.lower()
    return file_digest(model.path)


def file_digest(path: Path) -> str:
    """The sha256 of the file at ``path``, hashed once per (path, size, mtime) ("" if it cannot
    be read)."""
    try:
        stat = path.stat()
    except OSError:
        return ""
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _guard:
        if key in _known:
            return _known[key]
        lock = _hashing.setdefault(key, threading.Lock())
    with lock:  # a second request for the same file waits for the first one's hash
        with _guard:
            if key in _known:
                return _known[key]
        digest = _hash(path)
        with _guard:
            if digest:
                _known[key] = digest
            _hashing.pop(key, None)
    return digest


def _hash(path: Path) -> str:
    sha = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK):
                sha.update(chunk)
    except OSError:
        return ""
    return sha.hexdigest()
