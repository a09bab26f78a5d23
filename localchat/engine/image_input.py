"""Checking a picture a user gives before anything decodes it: its format, its size in pixels
(read from the file's header, so a 100-megapixel bomb is refused before a byte of it is
decoded), and that the file is whole. Plain logic over bytes, no model, no imaging library.

libmtmd decodes JPEG, PNG, BMP and GIF (stb_image; a GIF's first frame); anything else it hands
to ffprobe as a video, which localchat never wants: other formats are refused here, by name.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from localchat.errors import UserError

MAX_MEGAPIXELS = 50  # decoded RGB at this size is 150 MB; every projector downsamples far below
MAX_IMAGE_BYTES = 32 * 1024 * 1024  # a file read for an image (a text file's cap is 4 MB)


class BadImage(UserError):
    """A picture that cannot be read: the message names the file and why, in one line."""

    exit_code = 2


@dataclass(frozen=True)
class ImageInfo:
    format: str  # "PNG", "JPEG", "GIF", "BMP"
    width: int
    height: int
    frames: int = 1  # a GIF's frames (only the first is read)

    @property
    def megapixels(self) -> float:
        return self.width * self.height / 1e6

    def describe(self) -> str:
        return f"{self.format} {self.width}×{self.height}"


def check_image(data: bytes, name: str) -> ImageInfo:
    """What ``data`` (the file ``name``) is; BadImage for anything localchat will not read."""
    kind = _sniff(data)
    if kind is None:
        raise BadImage(f"{name} is not an image localchat reads (JPEG, PNG, BMP or GIF)"
                       + _other_format(data))
    try:
        info = _READERS[kind](data)
    except (struct.error, IndexError, ValueError):
        raise BadImage(f"{name} is a damaged or truncated {kind} file") from None
    if info.width <= 0 or info.height <= 0:
        raise BadImage(f"{name} is a {kind} file of {info.width}×{info.height} pixels: empty")
    if info.megapixels > MAX_MEGAPIXELS:
        raise BadImage(f"{name} is {info.width}×{info.height} pixels ({info.megapixels:.1f} "
                       f"megapixels); localchat reads images up to {MAX_MEGAPIXELS} megapixels: "
                       "scale it down first")
    return info


MIME_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp"}


def image_mime(data: bytes) -> str | None:
    """The MIME type of a picture localchat reads, from its first bytes; None for anything else."""
    kind = _sniff(data)
    return MIME_TYPES[kind] if kind is not None else None


def _sniff(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data.startswith(b"BM") and len(data) >= 26:
        return "BMP"
    return None


def _other_format(data: bytes) -> str:
    """``: it is WebP`` for the formats people try that the decoder lacks."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ": it is WebP"
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif"):
        return ": it is HEIC/AVIF"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return ": it is TIFF"
    return ""


def _png(data: bytes) -> ImageInfo:
    if data[12:16] != b"IHDR":
        raise ValueError("no IHDR")
    width, height = struct.unpack(">II", data[16:24])
    # A file cut short ends before its IEND chunk (a download stopped, a copy interrupted).
    if not data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82"):
        raise ValueError("no IEND")
    return ImageInfo("PNG", width, height)


def _jpeg(data: bytes) -> ImageInfo:
    size = None
    i = 2
    while i < len(data):
        if data[i] != 0xFF:
            raise ValueError("not a marker")
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            size = (width, height)
        if marker == 0xDA:  # scan data follows; the file must end with its EOI marker
            if size is None or data.find(b"\xff\xd9", i) < 0:
                raise ValueError("truncated scan")
            return ImageInfo("JPEG", *size)
        i += 2 + length
    raise ValueError("no scan")


def _gif(data: bytes) -> ImageInfo:
    width, height = struct.unpack("<HH", data[6:10])
    if not data.rstrip(b"\x00").endswith(b"\x3b"):
        raise ValueError("no trailer")
    return ImageInfo("GIF", width, height, frames=max(1, _gif_frames(data)))


def _gif_frames(data: bytes) -> int:
    """Image descriptors in the file (a walk over its blocks; 0 if it cannot be walked)."""
    flags = data[10]
    i = 13 + (3 * (2 << (flags & 7)) if flags & 0x80 else 0)
    frames = 0
    try:
        while i < len(data) and data[i] != 0x3B:
            if data[i] == 0x21:  # extension: label, then sub-blocks
                i += 2
            elif data[i] == 0x2C:  # image: descriptor, local table, LZW size, sub-blocks
                frames += 1
                local = data[i + 9]
                i += 10 + (3 * (2 << (local & 7)) if local & 0x80 else 0) + 1
            else:
                return frames
            while data[i]:
                i += data[i] + 1
            i += 1
    except IndexError:
        raise ValueError("truncated") from None
    return frames


def _bmp(data: bytes) -> ImageInfo:
    width, height = struct.unpack("<ii", data[18:26])
    (size,) = struct.unpack("<I", data[2:6])
    if size > len(data):
        raise ValueError("truncated")
    return ImageInfo("BMP", width, abs(height))


_READERS = {"PNG": _png, "JPEG": _jpeg, "GIF": _gif, "BMP": _bmp}
