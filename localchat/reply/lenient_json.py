"""JSON as small models write it: finding where a value ends in a stream, and reading it leniently.

A model that calls a tool writes a JSON object inside its reply, and not always valid JSON: a
trailing comma, single-quoted strings, Python's ``True``/``None``, a raw newline inside a string,
or an object cut off by ``max_tokens``. :func:`scan` walks one value from its opening bracket and
returns where it ends (None while it is still open) together with a strict-JSON rewriting of what
it has seen; :func:`parse` reads a value whole, closing whatever a cut left open, and says whether
it was complete.

A single quote opens a string only where a value or a key may start, and closes it only when what
follows could follow a string (``,`` ``:`` ``}`` ``]`` or the end): so ``'it's'`` keeps its
apostrophe, and a quote that cannot be read one way for certain is left as JSON would read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_PYTHON_WORDS = {"True": "true", "False": "false", "None": "null"}
_OPENERS = {"{": "}", "[": "]"}


@dataclass(frozen=True)
class Scan:
    """What :func:`scan` found: ``end`` is the index just past the value (None: still open), and
    ``text`` the strict JSON for what was read (for an open value: healed, every bracket closed)."""

    end: int | None
    text: str


def scan(source: str, start: int = 0) -> Scan:
    """Walk the JSON object or array that opens at ``source[start]`` (``{`` or ``[``), taking
    ``source`` as all there is."""
    walker = Walker(source, start)
    end = walker.run(final=True)
    return Scan(end, walker.healed() if end is None else walker.text())


def parse(text: str) -> tuple[Any, bool]:
    """(value, complete) of the JSON object or array at the start of ``text`` (after whitespace).

    Lenient as described above; a value cut short is healed and returned with complete False.
    Raises ValueError when no sensible value can be read.
    """
    stripped = text.lstrip()
    if not stripped or stripped[0] not in _OPENERS:
        try:
            return json.loads(stripped, strict=False), True
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc.msg}") from None
        except RecursionError:
            raise ValueError("nested too deeply") from None
    found = scan(stripped)
    try:
        value = json.loads(found.text, strict=False)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:  # json's own limit on nesting (about a thousand levels)
        raise ValueError("nested too deeply") from None
    return value, found.end is not None


class Walker:
    """One pass over a value that may still be arriving, writing strict JSON as it goes.

    ``extend`` adds text and ``run`` goes on from where it stopped, so a long value streamed in
    small pieces is read once. Where the next character decides what the last one meant (a
    single quote that may close a string, a word that may be ``True``), ``run`` waits for it
    unless told the text is final.
    """

    def __init__(self, source: str, start: int = 0) -> None:
        self.source = source
        self.pos = start
        self.out: list[str] = []
        self.stack: list[str] = []  # closing brackets still owed
        self.quote = ""  # the quote of the string we are in ("" outside strings)
        self.escaped = False
        self.end: int | None = None

    def extend(self, text: str) -> None:
        self.source += text

    def text(self) -> str:
        return "".join(self.out)

    def run(self, final: bool = False) -> int | None:
        """The index just past the value once it has ended, else None (more text is needed)."""
        source, n = self.source, len(self.source)
        while self.end is None and self.pos < n:
            i, ch = self.pos, source[self.pos]
            if self.quote:
                if not final and ch == "'" == self.quote and not source[i + 1:].strip():
                    return None  # closes the string or is an apostrophe: the next text says
                self._in_string(i, ch)
                continue
            if ch.isalpha():
                j = i
                while j < n and (source[j].isalnum() or source[j] == "_"):
                    j += 1
                if j == n and not final:
                    return None  # "Tru" may yet become True
                word = source[i:j]
                self.out.append(_PYTHON_WORDS.get(word, word))
                self.pos = j
                continue
            self.pos = i + 1
            self._outside_string(ch)
        return self.end

    def _outside_string(self, ch: str) -> None:
        if ch in _OPENERS:
            self.stack.append(_OPENERS[ch])
            self.out.append(ch)
        elif ch in "}]":
            self._drop_trailing_comma()
            self.out.append(ch)
            if not self.stack or self.stack[-1] != ch:
                self.end = self.pos  # unbalanced: json.loads will say what is wrong
                return
            self.stack.pop()
            if not self.stack:
                self.end = self.pos
        elif ch == '"' or (ch == "'" and self._value_may_start()):
            self.quote = ch
            self.out.append('"')
        else:
            self.out.append(ch)

    def _in_string(self, i: int, ch: str) -> None:
        self.pos = i + 1
        if self.escaped:
            self.escaped = False
            # \' is not a JSON escape: inside a single-quoted string it is just the quote.
            if ch == "'":
                self.out[-1] = "'"
            else:
                self.out.append(ch)
        elif ch == "\\":
            self.escaped = True
            self.out.append(ch)
        elif ch == self.quote and (ch == '"' or self._string_may_end(i + 1)):
            self.quote = ""
            self.out.append('"')
        elif ch == '"':  # inside a single-quoted string
            self.out.append('\\"')
        else:
            self.out.append(ch)

    def _value_may_start(self) -> bool:
        return self._last_significant() in ("", "{", "[", ",", ":")

    def _string_may_end(self, after: int) -> bool:
        rest = self.source[after:].lstrip()
        return not rest or rest[0] in ",:}]"

    def _last_significant(self) -> str:
        for piece in reversed(self.out):
            stripped = piece.strip()
            if stripped:
                return stripped[-1]
        return ""

    def _drop_trailing_comma(self) -> None:
        for k in range(len(self.out) - 1, -1, -1):
            if self.out[k].strip():
                if self.out[k] == ",":
                    del self.out[k]
                return

    def healed(self) -> str:
        """The text so far with an open string closed, a dangling comma or key dropped and every
        open bracket closed: the most a cut value can say."""
        out = list(self.out)
        if self.escaped:
            out.pop()  # a lone backslash cannot end a string
        if self.quote:
            out.append('"')
        text = "".join(out).rstrip()
        if text.endswith(","):
            text = text[:-1]
        if text.endswith(":"):
            text += " null"
        elif self.stack and self.stack[-1] == "}" and _ends_with_bare_key(text):
            text += ": null"
        return text + "".join(reversed(self.stack))


def _ends_with_bare_key(text: str) -> bool:
    """Whether an object's text ends with a key that has no colon yet (``{"a": 1, "b"``)."""
    if not text.endswith('"'):
        return False
    # Walk back over the final string to the character before it.
    k = len(text) - 2
    while k >= 0:
        if text[k] == '"' and (k == 0 or text[k - 1] != "\\"):
            break
        k -= 1
    before = text[:k].rstrip()
    return before.endswith(("{", ","))
