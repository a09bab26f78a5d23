"""Reading a TOML file, and finding the line a table or key is on, for error messages that
point at it ("FILE:LINE: ..."): config.toml's and models.toml's. A file that is a broken link
is an error, not a missing file (:func:`settings_file_present`).

tomllib reports a position only for malformed documents; a valid one that holds a wrong value
gets its line from :class:`LineIndex`, which scans headers and ``key =`` lines.
"""

from __future__ import annotations

import codecs
import re
import stat
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from localchat.errors import ConfigError
from localchat.paths import broken_link

_LINE_IN_MESSAGE = re.compile(r"\(at line (\d+), column \d+\)")


def settings_file_present(path: Path) -> bool:
    """Whether a settings file is at ``path`` (False: nothing is, and the defaults apply).

    A symbolic link that leads nowhere (its target moved, or it loops) is a ConfigError naming
    it, not a missing file: the settings the user keeps behind it (``[snapshots] enabled =
    false``, say) would be ignored without a word."""
    link = broken_link(path)
    if link:
        raise ConfigError(f"{path} {link}")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{path} is a folder, not a settings file")
    if not stat.S_ISREG(mode):  # reading a FIFO would wait for a writer for ever
        raise ConfigError(f"{path} is not a regular file (a FIFO, socket or device)")
    return True


def read_toml_file(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a TOML file; returns (data, text). Malformed TOML -> ConfigError "FILE:LINE: ...".
    A UTF-8 byte order mark at the start (as some Windows editors save) is read past."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ConfigError(f"{path} is UTF-16 text; save it as UTF-8")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start} is not)") from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _LINE_IN_MESSAGE.search(message)
        where = f"{path}:{match.group(1)}" if match else str(path)
        reason = _LINE_IN_MESSAGE.sub("", message).strip()
        raise ConfigError(f"{where}: invalid TOML: {reason}") from None
    except RecursionError:  # tomllib recurses once per level of nested arrays and inline tables
        raise ConfigError(f"{path}: invalid TOML: values are nested too deeply") from None


def find_line(text: str, table: str | None, key: str | None = None) -> int | None:
    """Line number of ``key = ...`` inside ``[table]``, or of the ``[table]`` header when ``key``
    is None; None when there is none (see :class:`LineIndex`)."""
    return LineIndex(text).find(table, key)


class LineIndex:
    """The line of every table header and ``key =`` line of a document, from one scan: a reader
    that places each of many entries (models.toml's) looks each up at once, where a scan per
    lookup made reading the catalogue take 21 ms, on ``serve``'s event loop at every listing.

    tomllib reports no positions for valid documents, so this scans headers and ``key =`` lines.
    A table is a dotted path of plain names (quoted header parts such as
    ``[models."qwen2.5-7b"]`` are matched after unquoting); the first line that matches counts.
    """

    def __init__(self, text: str) -> None:
        self._headers: dict[str, int] = {}
        self._keys: dict[tuple[str | None, str], int] = {}
        current: str | None = None
        for number, line in enumerate(text.splitlines(), start=1):
            header = _table_header(line)
            if header is not None:
                current = header
                self._headers.setdefault(header, number)
                continue
            stripped = line.strip()
            if "=" in stripped:
                key = _unquote(stripped.split("=", 1)[0].strip())
                self._keys.setdefault((current, key), number)

    def find(self, table: str | None, key: str | None = None) -> int | None:
        """``key``'s line inside ``[table]`` (None: the top level), or the header's when
        ``key`` is None; None when there is none."""
        if key is None:
            return None if table is None else self._headers.get(table)
        return self._keys.get((table, key))

    def line_of(self, table: str | None, key: str | None = None) -> int:
        """``find``, falling back to the table's header, then to 1."""
        return self.find(table, key) or self.find(table) or 1


def _table_header(line: str) -> str | None:
    """The dotted name of a ``[table]`` header line with quotes removed, else None."""
    stripped = line.strip()
    if not stripped.startswith("[") or stripped.startswith("[["):
        return None
    return ".".join(_unquote(part.strip()) for part in _header_parts(stripped))


def _header_parts(stripped: str) -> Iterable[str]:
    # A quoted part may itself contain "]", "." or "#", so split outside quotes only.
    quote, part = None, ""
    for char in stripped[1:]:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "]":
            break
        elif char == ".":
            yield part
            part = ""
            continue
        part += char
    yield part


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name
