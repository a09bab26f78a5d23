"""``ask --image PATH``: pictures attached to the question, read and checked before any model
loads (a file that is not an image, a truncated one, one over the size bound, a model that does
not read images: each one line and a non-zero exit, nothing stored). With ``--route remote`` the
pictures go to the remote, when it reads them (``[remote] images = true``), and the local model
need not read any."""

from __future__ import annotations

import argparse
from pathlib import Path

from localchat.errors import UserError
from localchat.events import Notice
from localchat.settings.remote import RemoteSettings


class ImagesRefused(UserError):
    """Pictures this ask cannot send (the model reads none, or they cannot go where asked)."""

    exit_code = 2


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
    if args.image and args.session is not None:
        raise ImagesRefused("--image cannot be used with --session yet: sessions do not store "
                            "pictures")


def check_route(route: str | None, remote: RemoteSettings) -> None:
    """ImagesRefused for ``--route remote`` when the remote is on but reads no pictures (with
    the remote off, the forced turn fails as any other does: the remote is off)."""
    if route == "remote" and remote.enabled and not remote.images:
        raise ImagesRefused("the remote model does not read pictures ([remote] images = false in "
                            "config.toml): --image cannot be sent with --route remote")


def check_model(model: str | None, default_model: str) -> None:
    """ImagesRefused unless ``model`` reads images here (``engine.vision.images_problem``)."""
    from localchat.engine.vision import images_problem
    from localchat.models.registry import resolve_model

    problem = images_problem(resolve_model(model or default_model))
    if problem:
        raise ImagesRefused(problem)
