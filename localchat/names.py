"""Names that come from users or remotes: checked once, where they enter, before they are shown,
stored or turned into a path.

- :func:`check_name`: a name shown on one line (a session, a model): not empty, valid UTF-8, no
  control characters (C0, DEL, C1), no bidi overrides or isolates (U+202A–202E, U+2066–2069) and no
  zero-width or other invisible formatting characters, which would make one name look like
  another or reorder the line it is printed on.
- :func:`check_file_name`: one path component (a file or folder name): a checked name that is
  also not ``.``, ``..`` or ``~`` and holds no ``/`` or ``\\``.
- :func:`path_under`: ``folder/part/part``: every part a file name, and the resolved path (symlinks
  followed) still inside ``folder``.

Each raises :class:`UnsafeName` (a :class:`UserError`) whose message names what was refused,
with the offending characters made visible by :func:`localchat.terminal.visible`. Which characters
are unsafe is :func:`localchat.terminal.unsafe_char`'s to say: one list for names and terminals.
"""

from __future__ import annotations

from pathlib import Path

from localchat.errors import UserError
from localchat.terminal import unsafe_char, visible


class UnsafeName(UserError):
    """A name that cannot be shown on one line or used as a file name as it is."""


def check_name(text: str, what: str = "name") -> str:
    """``text`` if it is a usable one-line name; else :class:`UnsafeName` saying why."""
    if not text.strip():
        raise UnsafeName(f"{what} cannot be empty")
    bad = sorted({ch for ch in text if unsafe_char(ch)})
    if bad:
        shown = " ".join(visible(ch, newlines=False) for ch in bad)
        raise UnsafeName(f"{what} '{visible(text, newlines=False)}' cannot hold control characters, "
                         f"invisible ones (bidi, zero-width) or non-UTF-8 bytes: {shown}")
    return text


def check_file_name(text: str, what: str = "file name") -> str:
    """``text`` if it can be one path component under a folder localchat owns."""
    check_name(text, what)
    if text in (".", "..", "~") or "/" in text or "\\" in text:
        raise UnsafeName(f"'{visible(text)}' is not a usable {what} "
                         "(a single name: no '/', '\\', '.' or '..')")
    return text


def path_under(folder: Path, *parts: str, what: str = "file name") -> Path:
    """``folder/parts...`` after checking every part with :func:`check_file_name` and that the
    path, with symlinks resolved, stays inside ``folder`` (a link planted there cannot lead out)."""
    for part in parts:
        check_file_name(part, what)
    path = folder.joinpath(*parts)
    if not path.resolve().is_relative_to(folder.resolve()):
        raise UnsafeName(f"{what} '{'/'.join(parts)}' leads outside {folder}")
    return path
