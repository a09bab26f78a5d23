"""GBNF text written from Python: literals, named rules, and the JSON primitives every schema's
grammar is built from.

GBNF is llama.cpp's grammar language (``grammars/README.md`` in llama.cpp): ``name ::= body``
rules, ``"literals"``, ``[character classes]``, grouping, ``|``, ``?``, ``*``, ``+`` and
``{m,n}`` repetitions. Nothing here needs a model.

Two choices shape every JSON grammar, both llama.cpp's own (``json_schema_to_grammar``):
whitespace between tokens is bounded (one newline and up to 20 indenting characters, or one
space), and so are a number's digits, because a small model that is allowed unbounded
whitespace or digits may write them until the reply's token limit.
"""

from __future__ import annotations

import re

# Bounded whitespace: nothing, one space, or a newline and an indent.
WS = '| " " | "\\n" [ \\t]{0,20}'
# One character of a JSON string: anything but a quote, a backslash or a control character,
# or an escape.
CHAR = '[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})'
MAX_DIGITS = 16  # of an integer part, a fraction or an exponent (llama.cpp's bound too)
INTEGER = f'"-"? ("0" | [1-9] [0-9]{{0,{MAX_DIGITS - 1}}})'
_FRACTION = f'("." [0-9]{{1,{MAX_DIGITS}}})? ([eE] [-+]? [0-9]{{1,3}})?'

# The shared rules by name: each schema grammar takes the ones it uses (``Rules.primitive``).
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: (body, rules it uses)
    "ws": (WS, ()),
    "char": (CHAR, ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "integer": (INTEGER, ()),
    "number": (f'{INTEGER} {_FRACTION}', ()),
    # A number that cannot be negative (a schema's minimum of 0 or more).
    "nonnegative-number": (f'("0" | [1-9] [0-9]{{0,{MAX_DIGITS - 1}}}) {_FRACTION}', ()),
    "boolean": ('"true" | "false"', ()),
    "null": ('"null"', ()),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" ws ( member ( "," ws member )* )? "}"', ("ws", "member")),
    "member": ('string ws ":" ws value ws', ("string", "ws", "value")),
    "array": ('"[" ws ( value ws ( "," ws value ws )* )? "]"', ("ws", "value")),
    # RFC 3339 dates and times (JSON Schema's "date", "time", "date-time") and UUIDs.
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )', ()),
    "time": ('( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? '
             '( [Zz] | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date [Tt] time', ("date", "time")),
    "uuid": ('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12}', ()),
}


def literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def repeat(item: str, at_least: int, at_most: int | None) -> str:
    """``item`` (one GBNF term) repeated ``at_least`` to ``at_most`` times (None: no bound)."""
    if at_most is None:
        return {0: f"{item}*", 1: f"{item}+"}.get(at_least, f"{item}{{{at_least},}}")
    if at_most == at_least:
        return "" if at_least == 0 else item if at_least == 1 else f"{item}{{{at_least}}}"
    if (at_least, at_most) == (0, 1):
        return f"{item}?"
    return f"{item}{{{at_least},{at_most}}}"


def alternatives(options: list[str]) -> str:
    """``options`` as one GBNF term: a group of alternatives, each kept once, in order."""
    unique = list(dict.fromkeys(options))
    if len(unique) == 1:
        return unique[0] if _is_term(unique[0]) else f"( {unique[0]} )"
    return "( " + " | ".join(unique) + " )"


def _sanitize(hint: str) -> str:
    """A rule name made of ``hint``: GBNF names are letters, digits and dashes."""
    return re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-").lower() or "rule"


def _is_term(text: str) -> bool:
    """Whether ``text`` is one rule name or literal (needs no parentheses around it)."""
    return bool(re.fullmatch(r'[a-zA-Z0-9-]+|"(?:[^"\\]|\\.)*"', text))


class Rules:
    """The named rules of one grammar. A rule is added under a name derived from a hint (the
    schema path it comes from); one with the same body as an earlier rule is that rule."""

    def __init__(self) -> None:
        self._bodies: dict[str, str] = {}
        self._names_by_body: dict[str, str] = {}

    def add(self, hint: str, body: str) -> str:
        """A rule for ``body``; its name: the rule with that body if there is one, else the name
        ``hint`` gives when it was reserved and is not defined yet (the rule a reference or the
        root stands for), else a new one."""
        existing = self._names_by_body.get(body)
        if existing is not None:
            return existing
        name = _sanitize(hint)
        if self._bodies.get(name) != "":
            name = self.reserve(hint)
        self.define(name, body)
        return name

    def reserve(self, hint: str) -> str:
        """A free name for a rule defined later (a recursive one refers to itself)."""
        base = _sanitize(hint)
        name, n = base, 1
        while name in self._bodies or name in PRIMITIVES:
            n += 1
            name = f"{base}-{n}"
        self._bodies[name] = ""
        return name

    def define(self, name: str, body: str) -> None:
        self._bodies[name] = body
        self._names_by_body.setdefault(body, name)

    def primitive(self, name: str) -> str:
        """The shared rule ``name`` (see PRIMITIVES) and the ones it uses, added once."""
        if name not in self._bodies:
            body, uses = PRIMITIVES[name]
            self._bodies[name] = body
            for used in uses:
                self.primitive(used)
        return name

    def text(self) -> str:
        """The grammar: ``root`` first, then the others in the order they were added."""
        order = sorted(self._bodies, key=lambda name: name != "root")
        return "".join(f"{name} ::= {self._bodies[name]}\n" for name in order)
