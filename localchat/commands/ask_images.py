"""``ask --image PATH``: pictures attached to the question, read and checked before any model
loads (a file that is not an image, a truncated one, one over the size bound, a model that does
not read images: each one line and a non-zero exit, nothing stored)."""

from __future__ import annotations

import argparse
from pathlib import Path

from localchat.chat.images import ImagesRefused
from localchat.events import Notice

__all__ = ["ImagesRefused", "add_flags", "check_flags", "check_model", "read_images"]


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="attach a picture (JPEG, PNG, BMP or GIF) to the question, for a model "
                   "that reads images (repeatable)")


def read_images(paths: list[str]) -> tuple[tuple[bytes, ...], list[Notice]]:
    """The pictures' bytes, checked (``engine.image_input``), and a notice per animated GIF."""
    from localchat.engine.image_input import MAX_IMAGE_BYTES, check_image
    from localchat.user_files import read_user_file

    images, notices = [], []
    for name in paths:
        data = read_user_file(Path(name), "attach a smaller picture", MAX_IMAGE_BYTES)
        info = check_image(data, name)
        if info.frames > 1:
            notices.append(Notice(f"{name} is an animated GIF ({info.frames} frames): only its "
                                  "first frame is read", kind="input"))
        images.append(data)
    return tuple(images), notices


def check_flags(args: argparse.Namespace) -> None:
    if not args.image:
        return
    if args.session is not None:
        raise ImagesRefused("--image cannot be used with --session yet: sessions do not store "
                            "pictures")
    if args.route == "remote":
        raise ImagesRefused("--image is read by the local model only: pictures are not sent to "
                            "the remote (--route remote)")


def check_model(model: str | None, default_model: str) -> None:
    """ImagesRefused unless ``model`` reads images here (``chat.images.check_model``)."""
    from localchat.chat.images import check_model as reads_images

    reads_images(model or default_model)
