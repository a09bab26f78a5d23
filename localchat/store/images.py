"""The pictures of stored messages: one file per picture, named by the SHA-256 of its bytes, in
``images/`` beside the session database (``<sha256>.png``), whoever attached it and however often.

A user's turn names its pictures (``ImageRef``, in the turn's row); the file is written, atomically
(``localchat.atomic``), before the turn that names it is committed, so a turn that survives a
``kill -9`` always finds its pictures, and reopening a session gives the engine the same bytes
(the same keys: its records and saved KV cache match without encoding them again), wherever the
original file went since. A file no stored turn or branch names any more is removed when
sessions are deleted or cleared (``remove_unused``); a file written in the last minutes is
kept, since its turn may be on its way into the database from another process.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from localchat.atomic import abandoned_temps, write_bytes_atomic
from localchat.engine.image_input import MAX_IMAGE_BYTES, ImageInfo, check_image
from localchat.engine.image_records import digest
from localchat.errors import UserError
from localchat.store.records import ImageRef, images_from_json
from localchat.user_files import UnreadableFile, read_user_file

# A picture stored this recently may belong to a turn another process is about to commit.
GRACE_S = 600.0


@dataclass(frozen=True)
class ImageFile:
    """A picture going with a message: what it is (``ref``) and its file's bytes."""

    ref: ImageRef
    data: bytes = field(repr=False)
    frames: int = 1  # a GIF's frames (the engine reads the first)


def image_file(name: str, data: bytes) -> ImageFile:
    """``data`` (the file ``name``, as the user named it) as a picture to send, checked by
    ``engine.image_input.check_image``: ``BadImage`` (one line) for one localchat will not read.
    The picture keeps the file's name, without its folder."""
    info: ImageInfo = check_image(data, name)
    ref = ImageRef(digest(data), Path(name).name, info.format, info.width, info.height)
    return ImageFile(ref, data, info.frames)


def read_image(path: Path) -> ImageFile:
    """The picture at ``path``, read and checked. Raises ``UserError`` in one line."""
    try:
        data = read_user_file(path, "attach a smaller picture", MAX_IMAGE_BYTES)
    except UnreadableFile as exc:
        raise UserError(f"No file {path}." if exc.missing else str(exc)) from None
    return image_file(str(path), data)


def images_dir(database: Path) -> Path:
    """Where the pictures of the sessions in ``database`` are kept."""
    return database.parent / "images"


def save(database: Path, image: ImageFile) -> None:
    """Keep ``image``'s bytes (once per picture: an existing copy is only marked as just used,
    so a sweep running meanwhile leaves it for the turn about to name it)."""
    path = images_dir(database) / image.ref.file_name
    try:
        if path.is_file() and path.stat().st_size == len(image.data):
            os.utime(path)
            return
        write_bytes_atomic(path, image.data)
    except OSError as exc:
        raise UserError(f"cannot store the picture {image.ref.name} in {path.parent}: "
                        f"{exc.strerror or exc}") from None


def load(database: Path, ref: ImageRef) -> bytes | None:
    """A stored picture's bytes; None when its file is gone or no longer the picture."""
    try:
        data = (images_dir(database) / ref.file_name).read_bytes()
    except OSError:
        return None
    return data if digest(data) == ref.sha256 else None


def names_in(turn_rows: list[str | None], branch_rows: list[str]) -> set[str]:
    """The stored files named by turns' ``images`` columns and by stored branches' turns."""
    refs = [ref for text in turn_rows for ref in images_from_json(text)]
    for text in branch_rows:
        for turn in json.loads(text):
            refs.extend(images_from_json(turn.get("images")))
    return {ref.file_name for ref in refs}


def remove_unused(database: Path, used: set[str], grace_s: float | None = None) -> int:
    """Delete the pictures whose names are not in ``used`` (and abandoned temp files); return
    how many pictures went. One stored in the last ``grace_s`` seconds (``GRACE_S``) stays."""
    grace_s = GRACE_S if grace_s is None else grace_s
    folder = images_dir(database)
    if not folder.is_dir():
        return 0
    for temp in abandoned_temps(folder):
        temp.unlink(missing_ok=True)
    removed, now = 0, time.time()
    for path in folder.iterdir():
        if path.name.startswith(".") or path.name in used:
            continue
        try:
            if now - path.stat().st_mtime < grace_s:
                continue
            path.unlink()
            removed += 1
        except OSError:
            continue
    return removed
