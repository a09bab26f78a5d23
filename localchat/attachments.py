"""Text files attached to a message (``/file PATH`` and ``@path`` in the app, ``ask -f PATH``).

A file goes into the message as a fenced block under its name, so the model sees where it starts
and ends and the conversation shows what was sent. Only text is accepted: a file with NUL bytes
or that is not UTF-8 is refused, and so is one that could not fit the model's context, with the
numbers, before anything is sent. What may be read at all (a file or a pipe, 4 MB at most; a
directory or a device named as such) is ``user_files``' rule, the same as ``--schema``'s.

``outgoing_message`` is the one rule for the message as it will be sent: the app's Enter, its
prefill while typing and ``ask`` all build the text the model sees with it, so what was
prefilled is what is sent. The prefill, handed the draft at every pause in typing, reads the files
it mentions through a ``FileReads`` cache; Enter reads them again.
"""

from __future__ import annotations

import codecs
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import UserError
from localchat.user_files import UnreadableFile, read_user_file


@dataclass(frozen=True)
class Attachment:
    path: Path
    text: str
    tokens: int
    estimated: bool = False  # counted without a tokenizer (no model loaded yet): about 4 chars/token
    note: str = ""  # something to tell the user about how it was read (its end was cut mid-character)

    @property
    def chip(self) -> str:
        """What the input shows for it: ``notes.md · 1,234 tokens``."""
        return f"{self.path.name} · {'~' if self.estimated else ''}{self.tokens:,} tokens"


CountTokens = Callable[[str], int]
ReadAttachment = Callable[[str, CountTokens | None, int | None], "Attachment"]


def read_attachment(path_text: str, count_tokens: CountTokens | None, max_tokens: int | None) -> Attachment:
    """Read a text file to attach. ``count_tokens`` is the model's tokenizer (None: estimate);
    ``max_tokens`` the most a message may hold (None: no limit known). Raises ``UserError``."""
    return _within(_read(Path(path_text).expanduser(), count_tokens), max_tokens)


def _read(path: Path, count_tokens: CountTokens | None) -> Attachment:
    try:
        data = read_user_file(path, "attach a smaller text file")
    except UnreadableFile as exc:
        raise UserError(f"No file {path}." if exc.missing else f"{path} {exc.reason}.") from None
    if b"\0" in data[:65536]:
        raise UserError(f"{path.name} looks binary (it has NUL bytes); only text files can be attached.")
    text, cut = _decoded(data, path.name)
    note = (f"{path.name} ends inside a character (is it still being written?): read up to its "
            "last whole character") if cut else ""
    tokens = count_tokens(text) if count_tokens is not None else (len(text) + 3) // 4
    return Attachment(path, text, tokens, estimated=count_tokens is None, note=note)


def _decoded(data: bytes, name: str) -> tuple[str, bool]:
    """The text of ``data`` (a leading byte order mark dropped), and whether its last bytes were
    the start of a character cut off by the end of the file (left out). A byte that is not UTF-8
    anywhere else refuses the file."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    try:
        text = decoder.decode(data, final=False)  # holds back an unfinished last character
    except UnicodeDecodeError as exc:
        at = exc.start + (3 if data.startswith(codecs.BOM_UTF8) else 0)
        raise UserError(f"{name} is not UTF-8 text (byte {at} is not); only text files can be "
                        "attached.") from None
    return text, bool(decoder.getstate()[0])


def _within(attachment: Attachment, max_tokens: int | None) -> Attachment:
    if max_tokens is not None and attachment.tokens > max_tokens:
        raise UserError(f"{attachment.path.name} is {'about ' if attachment.estimated else ''}"
                        f"{attachment.tokens:,} tokens; a message can hold at most {max_tokens:,} "
                        "with this model's context.")
    return attachment


class FileReads:
    """Files read and counted for a draft, reused while each keeps its size and modification
    time (and the tokenizer is the same): the draft is handed over at every pause in typing, and
    a large file would be read and tokenized each time. A change within the file system's time
    resolution that keeps the size can go unseen here, which costs only a prefill that Enter's
    own read does not reuse. ``read`` is ``read_attachment``, from any thread."""

    MAX_FILES = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: OrderedDict[tuple[str, int, int, CountTokens | None], Attachment] = OrderedDict()

    def read(self, path_text: str, count_tokens: CountTokens | None, max_tokens: int | None) -> Attachment:
        path = Path(path_text).expanduser()
        try:
            stat = path.stat()
        except OSError:
            return read_attachment(path_text, count_tokens, max_tokens)  # which says why
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, count_tokens)
        with self._lock:
            attachment = self._files.get(key)
        if attachment is None:
            attachment = _read(path, count_tokens)
            with self._lock:
                self._files[key] = attachment
                while len(self._files) > self.MAX_FILES:
                    self._files.popitem(last=False)
        return _within(attachment, max_tokens)


def with_attachments(message: str, attachments: list[Attachment]) -> str:
    """The message as sent: each file as a fenced block under its name, then the text."""
    parts = []
    for attachment in attachments:
        fence = "````" if "```" in attachment.text else "```"
        language = attachment.path.suffix.lstrip(".")
        parts.append(f"File `{attachment.path.name}`:\n{fence}{language}\n{attachment.text.rstrip()}\n{fence}")
    return "\n\n".join([*parts, message]) if parts else message


# A picture's name: the app attaches ``@photo.png`` as an image, not as text.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def is_image_name(path_text: str) -> bool:
    return path_text.lower().endswith(IMAGE_SUFFIXES)


def mentioned_files(message: str, cwd: Path | None = None, *, images: bool | None = None) -> list[str]:
    """``@path`` words of ``message`` that name existing files (``@`` alone or an address is not
    one); a relative path is taken from ``cwd`` (default: the working directory). ``images``:
    only pictures' names (True), none of them (False), or any file (None)."""
    found = []
    for word in message.split():
        candidate = word[1:].rstrip(".,;:!?)")
        if word.startswith("@") and candidate and _in(cwd, candidate).is_file() \
                and (images is None or is_image_name(candidate) == images):
            found.append(candidate)
    return found


def outgoing_message(text: str, attached: Sequence[Attachment], cwd: Path, *,
                     count_tokens: CountTokens | None = None, room: int | None = None,
                     files: Sequence[str] = (), read: ReadAttachment = read_attachment,
                     images_apart: bool = False) -> str:
    """The message as it will be sent: ``text`` with the files ``attached`` already (``/file``),
    those named in ``files`` (``ask -f``) and those it mentions as ``@path`` (relative to
    ``cwd``), each file once, as fenced blocks before the text.

    ``count_tokens`` and ``room`` are as for ``read_attachment``, ``room`` for all the files
    together (``context.budget.message_room``); ``read`` reads each file (a draft's:
    ``FileReads.read``). ``images_apart``: an ``@photo.png`` is a picture the caller attaches,
    not a text file. Raises ``UserError`` for a file that cannot go.
    """
    attachments = list(attached)
    if room is not None:
        room -= sum(a.tokens for a in attachments)
    mentioned = mentioned_files(text, cwd, images=False if images_apart else None)
    for path_text in [*files, *mentioned]:
        path = _in(cwd, path_text)
        if any(_same_file(a.path, path) for a in attachments):
            continue
        attachment = read(str(path), count_tokens, room)
        if room is not None:
            room -= attachment.tokens
        attachments.append(attachment)
    return with_attachments(text, attachments)


def _in(cwd: Path | None, path_text: str) -> Path:
    path = Path(path_text).expanduser()
    return path if cwd is None else cwd / path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def complete_path(fragment: str) -> list[str]:
    """Paths starting with ``fragment`` (folders end with /), for ``@`` completion."""
    base = Path(fragment).expanduser()
    folder, stem = (base, "") if fragment.endswith("/") else (base.parent, base.name)
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    prefix = fragment[: len(fragment) - len(stem)]
    return [prefix + e.name + ("/" if e.is_dir() else "") for e in entries
            if e.name.startswith(stem) and (stem.startswith(".") or not e.name.startswith("."))][:50]
