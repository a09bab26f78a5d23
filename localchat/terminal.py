"""What reaches a terminal: text from models, sessions and remotes must not drive it.

Stored names, titles and replies may hold escape sequences (clear the screen, retitle the window,
an OSC 52 clipboard write), C1 controls, bidi overrides that reorder the line they are on, or
zero-width characters. :func:`visible` shows each of them as inert text (``^[`` for ESC,
``\\x9b`` for a C1 control, ``<U+202E>`` for an invisible one, ``\\xff`` for a byte that was not
UTF-8); newlines and tabs pass unless asked otherwise.

:func:`guard_std_streams` applies it, once, to every command's stdout and stderr that is a
terminal (the CLI calls it before running a command); a pipe or a file gets the bytes exactly
(``--export > f.md``, ``--json``). Code that writes its own styling (rich's progress bar, dimmed
reasoning) writes to :func:`raw` of the stream, only where :func:`shows_styles` (not with
``TERM=dumb``), and runs any text it did not write itself through :func:`visible`.
"""

from __future__ import annotations

import io
import os
import sys
import unicodedata
from typing import TextIO

# Invisible characters that reorder or hide text: bidi embeddings/overrides/isolates and marks,
# zero-width space/joiners, word joiner and friends, the BOM.
_INVISIBLE = frozenset(
    [0x061C, 0x180E, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0xFEFF, 0x2028, 0x2029,
     *range(0x202A, 0x202F), *range(0x2060, 0x2065), *range(0x2066, 0x206A)]
)


def unsafe_char(ch: str) -> bool:
    """Whether ``ch`` must not appear in a name: a control, invisible or undecodable character
    (``names`` refuses these; :func:`visible` shows them as inert text)."""
    code = ord(ch)
    if code < 0x20 or 0x7F <= code < 0xA0 or code in _INVISIBLE:
        return True
    if 0xD800 <= code < 0xE000:  # a lone surrogate: bytes that were not UTF-8 (surrogateescape)
        return True
    return unicodedata.category(ch) == "Cf"  # any other invisible format character


def visible(text: str, *, newlines: bool = True) -> str:
    """``text`` with every control, invisible or undecodable character shown as inert text.

    With ``newlines=False``, newline and tab are shown too (``^J``, ``^I``): for one-line cells.
    """
    if text.isprintable():  # the common case, and every character it lets pass is harmless
        return text
    return "".join(_shown(ch, newlines) for ch in text)


def _shown(ch: str, newlines: bool) -> str:
    if ch in "\n\t" and newlines:
        return ch
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        return "^" + chr(code ^ 0x40)  # caret notation, as terminals show typed controls
    if 0x80 <= code < 0xA0:  # C1 controls (CSI, OSC, ...) as 8-bit characters
        return f"\\x{code:02x}"
    if 0xDC80 <= code < 0xDD00:  # surrogateescape: the byte that was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if unsafe_char(ch):
        return f"<U+{code:04X}>"
    return ch  # printable in a terminal, though not to str.isprintable (e.g. some spaces)


class TerminalStream(io.TextIOBase):
    """A text stream that passes everything written to it through :func:`visible`."""

    def __init__(self, stream: TextIO) -> None:
        self.raw = stream

    def write(self, text: str) -> int:
        self.raw.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only here, as on sys.stdout
        return self.raw.encoding

    def __repr__(self) -> str:
        return f"TerminalStream({self.raw!r})"


def guard(stream: TextIO) -> TextIO:
    """``stream`` itself when it is not a terminal, else a :class:`TerminalStream` over it."""
    if isinstance(stream, TerminalStream) or not _is_terminal(stream):
        return stream
    return TerminalStream(stream)  # type: ignore[return-value]  # a TextIOBase is a text stream


def guard_std_streams() -> None:
    """Neutralise, for the rest of the process, what is written to ``sys.stdout`` and
    ``sys.stderr`` where they are terminals."""
    sys.stdout = guard(sys.stdout)
    sys.stderr = guard(sys.stderr)


def shows_styles(stream: TextIO) -> bool:
    """Whether escape sequences that style text (dim, bold) may be written to ``stream``: it is a
    terminal, and not one that says it cannot show them (``TERM=dumb`` or ``unknown``; an unset
    TERM too, except on Windows, whose consoles set none)."""
    if not _is_terminal(stream):
        return False
    term = os.environ.get("TERM", "")
    if term in ("dumb", "unknown"):
        return False
    return bool(term) or sys.platform == "win32"


def raw(stream: TextIO) -> TextIO:
    """The stream under a :class:`TerminalStream` (for output that carries its own escapes)."""
    return stream.raw if isinstance(stream, TerminalStream) else stream


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # a closed stream
        return False
