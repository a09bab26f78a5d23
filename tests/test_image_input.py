"""Pictures a user gives, checked before anything decodes them (engine/image_input.py)."""

from __future__ import annotations

import pytest
from image_fixture import bmp, gif, jpeg, png, png_header_only

from localchat.engine.image_input import BadImage, check_image


@pytest.mark.parametrize("data, kind, size", [
    (png(40, 30), "PNG", (40, 30)),
    (jpeg(24, 16), "JPEG", (24, 16)),
    (gif(20, 10), "GIF", (20, 10)),
    (bmp(7, 5), "BMP", (7, 5)),
])
def test_the_formats_the_decoder_reads_are_told_with_their_size(data, kind, size):
    info = check_image(data, "x")
    assert (info.format, (info.width, info.height), info.frames) == (kind, size, 1)


def test_an_animated_gif_counts_its_frames():
    assert check_image(gif(8, 8, [(255, 0, 0), (0, 255, 0), (0, 0, 255)]), "a.gif").frames == 3


@pytest.mark.parametrize("data, message", [
    (b"just some text\n", "notes.txt is not an image localchat reads (JPEG, PNG, BMP or GIF)"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "is not an image localchat reads (JPEG, PNG, BMP or GIF): it is WebP"),
    (png(40, 30)[:-20], "notes.txt is a damaged or truncated PNG file"),
    (jpeg(24, 16)[:-40], "notes.txt is a damaged or truncated JPEG file"),
    (gif(20, 10)[:-1], "notes.txt is a damaged or truncated GIF file"),
    (b"\x89PNG\r\n\x1a\n", "notes.txt is a damaged or truncated PNG file"),
])
def test_what_is_not_a_whole_image_is_refused_in_one_line(data, message):
    with pytest.raises(BadImage) as caught:
        check_image(data, "notes.txt")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_picture_over_the_bound_is_refused_with_the_numbers_from_its_header():
    # A 10000x6000 PNG is refused from its 33-byte header: nothing else of it exists.
    with pytest.raises(BadImage) as caught:
        check_image(png_header_only(10000, 6000) + b"IEND\xaeB`\x82", "huge.png")
    assert str(caught.value) == ("huge.png is 10000×6000 pixels (60.0 megapixels); localchat "
                                 "reads images up to 50 megapixels: scale it down first")
