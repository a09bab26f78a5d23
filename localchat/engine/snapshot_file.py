"""KV snapshots: a conversation's KV cache as data (``KVSnapshot``: what the engine exports and
imports) and on disk, saved after each turn, so reopening a session restores the cache in
milliseconds instead of prefilling the whole conversation again.

This module is the snapshot *format*; it imports nothing that loads llama.cpp or numpy, so
``localchat sessions --prune`` and other housekeeping stay light.

One file per session in the cache dir. A file holds a JSON header (the engine fingerprint the
state belongs to, the exact per-message token records, the session's context window) and
llama.cpp's sequence state, followed by a sha256 of both. Files are written to a temp name and
renamed, so a crash mid-write never leaves a file that loads wrong data; a damaged, stale or
foreign file is refused with a reason and the caller rebuilds by prefilling. The folder is kept
under a byte cap by evicting the least recently used files.

A writer killed mid-write (SIGTERM while a snapshot is saved) leaves its temp file behind. Each
save sweeps the temp files no live writer holds (``atomic.abandoned_temps``: the writer's lock
died with it, so no grace period is needed), and the cap counts the ones still being written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localchat.atomic import abandoned_temps, atomic_writer
from localchat.engine.layout import CachedMessage
from localchat.settings import SnapshotsSection

# Version 2 records which cells are exact (``exact_n``). Version 1 files may hold cells that were
# rotated into place and are refused: the session is rebuilt by prefilling.
MAGIC = b"LCKVSNP2"
_OLD_MAGICS = (b"LCKVSNP1",)
SUFFIX = ".kvsnap"
_TEMPS = f".*{SUFFIX}.*.tmp"  # atomic_writer's temp files for snapshots
_LENGTH = struct.Struct("<Q")


def engine_fingerprint(model_path: Path, n_ctx: int, kv_type: str, template: str,
                       projector: Path | None = None) -> dict[str, Any]:
    """What a saved KV state depends on: the model file, context size, KV type, template and
    llama.cpp version, and the image projector when one is loaded (its pictures' cells). A
    snapshot taken under another fingerprint must not be restored."""
    import llama_cpp  # only its version: a loaded engine asks, housekeeping never does

    stat = model_path.stat()
    extra = {}
    if projector is not None:
        extra = {"projector_file": projector.name, "projector_size": projector.stat().st_size}
    return {
        **extra,
        "model_file": model_path.name,
        "model_size": stat.st_size,
        "model_mtime_ns": stat.st_mtime_ns,
        "n_ctx": n_ctx,
        "kv_type": kv_type,
        "llama_cpp": getattr(llama_cpp, "__version__", "?"),
        "template": hashlib.sha256(template.encode()).hexdigest()[:16],
    }


@dataclass
class KVSnapshot:
    """A conversation's KV cache: the per-message token records and llama.cpp's sequence state."""

    records: list[CachedMessage]
    state: bytes | memoryview  # llama.cpp's sequence state, as exported or read from disk
    exact_n: int = 0  # leading cells computed in order (see engine.kv.ConversationCache)
    # The rollback states of a memory that cannot drop cells, as (cells held, data): kept with a
    # snapshot in RAM (engine.state_pool), never written to a file.
    checkpoints: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        """What the snapshot holds in memory (its llama.cpp state and checkpoints)."""
        return len(self.state) + sum(len(data) for _, data in self.checkpoints)

    @property
    def n_tokens(self) -> int:
        return sum(len(m.tokens) for m in self.records)


class SnapshotUnusable(Exception):
    """The snapshot exists but must not be restored (the message says why, for a notice)."""


@dataclass
class SavedSnapshot:
    snapshot: KVSnapshot
    meta: dict[str, Any]  # the session's context window when it was saved (first_visible, summary...)


class SnapshotStore:
    def __init__(self, directory: Path, cap_bytes: int = SnapshotsSection.max_bytes) -> None:
        self.directory = Path(directory)
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()
        self._failing = False
        self._notice: str | None = None

    def path_for(self, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in key)
        return self.directory / f"{safe}{SUFFIX}"

    # -- writing -------------------------------------------------------------------------------

    def save(self, key: str, fingerprint: dict, snapshot: KVSnapshot,
             meta: dict | None = None) -> Path | None:
        """Write the snapshot for ``key`` atomically, then evict old files beyond the cap.

        Snapshots are a cache: a write that fails (a full disk, a folder where the file should
        be) keeps the previous file, returns None, is tried again with the next save, and is
        reported once per run of failures (``take_notice``), never as a traceback."""
        try:
            path = self._write(key, fingerprint, snapshot, meta)
        except OSError as exc:
            with self._lock:
                if not self._failing:  # one notice per run of failures
                    self._notice = (f"could not save this session's context ({_cause(exc)}); "
                                    "the previous one is kept and saving is retried after the "
                                    "next reply")
                self._failing = True
            return None
        with self._lock:
            self._failing = False
        return path

    def take_notice(self) -> str | None:
        """The save failure to report, once (None when there is nothing new)."""
        with self._lock:
            notice, self._notice = self._notice, None
        return notice

    def _write(self, key: str, fingerprint: dict, snapshot: KVSnapshot, meta: dict | None) -> Path:
        header = json.dumps({
            "key": key,
            "fingerprint": fingerprint,
            "meta": meta or {},
            "records": [asdict(r) for r in snapshot.records],
            "exact_n": snapshot.exact_n,
            "state_bytes": len(snapshot.state),
        }).encode("utf-8")
        digest = hashlib.sha256(header)
        digest.update(snapshot.state)
        target = self.path_for(key)
        with atomic_writer(target) as f:
            f.write(MAGIC + _LENGTH.pack(len(header)) + header)
            f.write(snapshot.state)
            f.write(digest.digest())
        self.evict(keep=target)
        return target

    # -- reading -------------------------------------------------------------------------------

    def load(self, key: str, fingerprint: dict) -> SavedSnapshot | None:
        """The snapshot for ``key``; None if there is none. Raises SnapshotUnusable when the
        file is damaged or was taken with another model or settings."""
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SnapshotUnusable(f"cannot read the saved context ({exc.strerror})") from None
        header, state = _parse(data)
        if header.get("key") != key:
            raise SnapshotUnusable("the saved context belongs to another session")
        if header.get("fingerprint") != fingerprint:
            raise SnapshotUnusable("the saved context was made with another model or settings")
        try:
            records = [CachedMessage(**r) for r in header["records"]]
            exact_n = int(header["exact_n"])
        except (KeyError, TypeError, ValueError):
            raise SnapshotUnusable("the saved context is damaged") from None
        os.utime(path)  # recently used: last to be evicted
        return SavedSnapshot(KVSnapshot(records, state, exact_n), header.get("meta", {}))

    def discard(self, key: str) -> None:
        try:
            self.path_for(key).unlink(missing_ok=True)
        except OSError:
            pass  # e.g. a folder in its place: it is not restored either (load refuses it)

    # -- housekeeping --------------------------------------------------------------------------

    def files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)

    def temp_files(self) -> list[Path]:
        """Snapshots being written now (or left by a writer that died: see ``evict``)."""
        if not self.directory.is_dir():
            return []
        return list(self.directory.glob(_TEMPS))

    def total_bytes(self) -> int:
        return sum(_size(p) for p in self.files() + self.temp_files())

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Delete temp files left by writers that died, then least recently used snapshots until
        the folder, with the snapshots still being written, is under the cap (best effort: a
        stray folder or a file removed meanwhile is skipped)."""
        try:
            return self._sweep_abandoned() + self._evict(keep)
        except OSError:
            return []

    def _sweep_abandoned(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        removed = []
        for path in abandoned_temps(self.directory, _TEMPS):
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def _evict(self, keep: Path | None) -> list[Path]:
        removed = []
        files = self.files()
        total = sum(_size(p) for p in files + self.temp_files())
        for path in files:
            if total <= self.cap_bytes:
                break
            if path == keep:
                continue
            total -= path.stat().st_size
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def prune(self, keep_keys: set[str] | None = None) -> tuple[int, int]:
        """Delete every snapshot (or every one not in ``keep_keys``) and the temp files of
        writers that died (not those of a save in progress); returns (files removed, bytes freed)."""
        count = freed = 0
        keep = {self.path_for(k) for k in keep_keys or ()}
        if not self.directory.is_dir():
            return 0, 0
        for path in self.directory.glob(f"*{SUFFIX}"):
            if path in keep:
                continue
            freed += _size(path)
            path.unlink(missing_ok=True)
            count += 1
        for path in abandoned_temps(self.directory):
            freed += _size(path)
            path.unlink(missing_ok=True)
            count += 1
        return count, freed


def _parse(data: bytes) -> tuple[dict, bytes]:
    if data.startswith(_OLD_MAGICS):
        raise SnapshotUnusable("the saved context was made by an older localchat")
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size + 32:
        raise SnapshotUnusable("the saved context is not a localchat snapshot or is truncated")
    offset = len(MAGIC)
    (header_len,) = _LENGTH.unpack_from(data, offset)
    offset += _LENGTH.size
    header_bytes = data[offset:offset + header_len]
    body_end = len(data) - 32
    state = data[offset + header_len:body_end]
    digest = hashlib.sha256(header_bytes)
    digest.update(state)
    if len(header_bytes) != header_len or digest.digest() != data[body_end:]:
        raise SnapshotUnusable("the saved context is damaged (checksum mismatch)")
    try:
        header = json.loads(header_bytes)
    except ValueError:
        raise SnapshotUnusable("the saved context is damaged") from None
    if header.get("state_bytes") != len(state):
        raise SnapshotUnusable("the saved context is truncated")
    return header, state


def _size(path: Path) -> int:
    """Bytes of ``path``; 0 once it is gone (a temp renamed or swept meanwhile)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _cause(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk full"
    return exc.strerror or type(exc).__name__
