"""The hand-written image files the tests use live with the image bench (``bench.synthetic_images``)."""

from localchat.bench.synthetic_images import bmp, gif, jpeg, png, png_header_only  # noqa: F401
