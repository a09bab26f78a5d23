"""Real image files made by hand (no imaging library): PNG, GIF (still and animated), baseline
JPEG and BMP bytes of a solid colour, for ``bench --images`` and the tests.
"""

from __future__ import annotations

import struct
import zlib

RGB = tuple[int, int, int]


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def _png_header(width: int, height: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def png(width: int, height: int, rgb: RGB = (255, 0, 0)) -> bytes:
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return _png_header(width, height) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` and stops after its header (size checks read no
    further)."""
    return _png_header(width, height)


def bmp(width: int, height: int, rgb: RGB = (255, 0, 0)) -> bytes:
    row = bytes((rgb[2], rgb[1], rgb[0])) * width
    row += b"\x00" * ((4 - len(row) % 4) % 4)
    pixels = row * height
    header = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + len(pixels), 0, 0, 54) + header + pixels


def gif(width: int, height: int, colours: list[RGB] | None = None) -> bytes:
    """A GIF with one frame per colour (two or more: an animated GIF, looping)."""
    colours = colours or [(255, 0, 0)]
    palette = b"".join(bytes(c) for c in colours)
    size = 1
    while (1 << size) < max(2, len(colours)):
        size += 1
    palette += b"\x00\x00\x00" * ((1 << size) - len(colours))
    out = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80 | (size - 1), 0, 0) + palette
    if len(colours) > 1:
        out += b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
    for index in range(len(colours)):
        out += b"\x21\xf9\x04\x00\x0a\x00\x00\x00"  # 0.1 s per frame
        out += b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
        out += _lzw_solid(index, width * height, max(2, size))
    return out + b"\x3b"


def _lzw_solid(index: int, n_pixels: int, min_code: int) -> bytes:
    """LZW data of ``n_pixels`` pixels of palette ``index``: a clear code before each pixel keeps
    the code width fixed (valid, if not small)."""
    clear, end, width = 1 << min_code, (1 << min_code) + 1, min_code + 1
    codes = []
    for _ in range(n_pixels):
        codes += [clear, index]
    codes.append(end)
    bits, n_bits, data = 0, 0, bytearray()
    for code in codes:
        bits |= code << n_bits
        n_bits += width
        while n_bits >= 8:
            data.append(bits & 0xFF)
            bits >>= 8
            n_bits -= 8
    if n_bits:
        data.append(bits)
    blocks = b"".join(bytes([len(data[i:i + 255])]) + bytes(data[i:i + 255])
                      for i in range(0, len(data), 255))
    return bytes([min_code]) + blocks + b"\x00"


# Baseline JPEG, one grey/luma component, every 8x8 block the same flat value: only DC terms.
_DC_CODES = {0: (0b00, 2), 1: (0b010, 3), 2: (0b011, 3), 3: (0b100, 3), 4: (0b101, 3),
             5: (0b110, 3), 6: (0b1110, 4), 7: (0b11110, 5), 8: (0b111110, 6),
             9: (0b1111110, 7), 10: (0b11111110, 8), 11: (0b111111110, 9)}
_DC_BITS = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
_AC_BITS = [0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D]
_AC_VALUES = bytes.fromhex(
    "01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25"
    "262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a"
    "838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9ca"
    "d2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9fa")


def jpeg(width: int, height: int, grey: int = 128) -> bytes:
    """A baseline greyscale JPEG of one flat ``grey`` level."""
    def segment(marker: int, body: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(body) + 2) + body

    out = b"\xff\xd8" + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    out += segment(0xDB, b"\x00" + b"\x01" * 64)  # quantization all ones
    out += segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    out += segment(0xC4, b"\x00" + bytes(_DC_BITS) + bytes(range(12)))
    out += segment(0xC4, b"\x10" + bytes(_AC_BITS) + _AC_VALUES)
    out += segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    dc = (grey - 128) * 8  # the DC term of a flat block (1/8 of 64 times the level shift)
    bits: list[int] = []
    previous = 0
    for _ in range(blocks):
        diff = dc - previous
        previous = dc
        size = abs(diff).bit_length()
        code, length = _DC_CODES[size]
        bits += [(code >> (length - 1 - i)) & 1 for i in range(length)]
        if size:
            value = diff if diff > 0 else diff + (1 << size) - 1
            bits += [(value >> (size - 1 - i)) & 1 for i in range(size)]
        bits += [1, 0, 1, 0]  # AC: end of block (code 1010 in the standard table)
    bits += [1] * ((8 - len(bits) % 8) % 8)
    data = bytearray()
    for i in range(0, len(bits), 8):
        byte = int("".join(map(str, bits[i:i + 8])), 2)
        data.append(byte)
        if byte == 0xFF:
            data.append(0)
    return out + bytes(data) + b"\xff\xd9"
