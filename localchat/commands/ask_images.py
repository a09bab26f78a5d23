"""``ask --image PATH``: pictures attached to the question, read and checked before any model
loads (a file that is not an image, a truncated one, one over the size bound, a model that does
not read images: each one line and a non-zero exit, nothing stored). With ``--session`` the
pictures are stored with the question (``store.images``). With ``--route remote`` they go to the
remote, when it reads them (``[remote] images = true``), and the local model need not read any."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.chat.images import ImagesRefused
from localchat.events import Notice
from localchat.settings.remote import RemoteSettings

if TYPE_CHECKING:
    from localchat.store.images import ImageFile

__all__ = ["ImagesRefused", "add_flags", "check_model", "check_route", "read_images"]


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="attach a picture (JPEG, PNG, BMP or GIF) to the question, for a model "
                   "that reads images (repeatable)")


def read_images(paths: list[str]) -> tuple[tuple[ImageFile, ...], list[Notice]]:
    """The pictures, checked (``engine.image_input``), and a notice per animated GIF."""
    from localchat.engine.image_input import MAX_IMAGE_BYTES
    from localchat.store.images import image_file
    from localchat.user_files import read_user_file

    images, notices = [], []
    for name in paths:
        data = read_user_file(Path(name), "attach a smaller picture", MAX_IMAGE_BYTES)
        image = image_file(name, data)
        if image.frames > 1:
            notices.append(Notice(f"{name} is an animated GIF ({image.frames} frames): only its "
                                  "first frame is read", kind="input"))
        images.append(image)
    return tuple(images), notices


def check_route(route: str | None, remote: RemoteSettings) -> None:
    """ImagesRefused for ``--route remote`` when the remote is on but reads no pictures (with
    the remote off, the forced turn fails as any other does: the remote is off)."""
    if route == "remote" and remote.enabled and not remote.images:
        raise ImagesRefused("the remote model does not read pictures ([remote] images = false in "
                            "config.toml): --image cannot be sent with --route remote")


def check_model(model: str | None, default_model: str) -> None:
    """ImagesRefused unless ``model`` reads images here (``chat.images.check_model``)."""
    from localchat.chat.images import check_model as reads_images

    reads_images(model or default_model)
