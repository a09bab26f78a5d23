"""A JSON Schema as a GBNF grammar (``schema_grammar``): the answers the grammar lets a model
write are JSON values of the schema's shape.

What is enforced while sampling and what is only checked afterwards is listed in
``formats.keywords``; a keyword outside both is refused, and so is a schema that contradicts
itself (``minItems`` above ``maxItems``, a ``const`` of another type, a required property that
``additionalProperties: false`` forbids...): each is one FormatError naming the place in the
schema. Choices, as llama.cpp's own converter makes them:

- Objects list their properties in the schema's order, and only those unless
  ``additionalProperties`` allows more (absent, it allows none in the grammar: a small model
  given the freedom invents keys; an answer without them is still valid).
- ``prefixItems`` are all written, as a tuple.
- ``anyOf`` and ``oneOf`` are alternatives (that exactly one ``oneOf`` branch matches is checked
  afterwards); ``allOf`` is taken with one schema only (pydantic wraps a ``$ref`` in it).
- ``$ref`` points inside the schema (``#``, ``#/$defs/name``, any JSON pointer); recursion is
  fine as long as a value is written before the schema refers to itself again.
- Repetitions are bounded in the grammar up to REPEAT_LIMIT (longer ``maxItems`` and
  ``maxLength``, and what a larger minimum asks beyond it, are checked afterwards), because
  llama.cpp unrolls ``x{m,n}`` into n rules; so are integer bounds beyond 16 digits.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import unquote

from localchat.errors import FormatError
from localchat.formats.gbnf import MAX_DIGITS, Rules, alternatives, literal, repeat
from localchat.formats.keywords import (
    ANNOTATIONS,
    FORMATS,
    FORMATS_ENFORCED,
    IMPLIED_TYPES,
    KNOWN,
    TYPES,
)
from localchat.formats.ranges import integer_range
from localchat.formats.validate import is_type

REPEAT_LIMIT = 100
DEFINITIONS = ("$defs", "definitions")  # hold schemas for $ref: allowed beside any keyword


def schema_grammar(schema: Any) -> str:
    """The GBNF grammar (root rule ``root``) of the JSON values ``schema`` allows.
    FormatError for what cannot be enforced or contradicts itself."""
    if not isinstance(schema, dict):
        raise FormatError("the schema must be a JSON object, such as {\"type\": \"object\", ...}")
    try:
        return _Converter(schema).grammar()
    except RecursionError:
        raise FormatError("the schema nests too deeply to be turned into a grammar") from None


def schema_rule(schema: Any, rules: Rules, hint: str) -> str:
    """The name of a rule, added to ``rules``, for the JSON values ``schema`` allows: for a
    grammar that holds several schemas (a tool call's arguments, one schema per tool).
    FormatError as ``schema_grammar``."""
    if not isinstance(schema, dict):
        raise FormatError("the schema must be a JSON object, such as {\"type\": \"object\", ...}")
    converter = _Converter(schema, rules)
    name = rules.reserve(hint)
    try:
        converter._define(name, converter.term(schema, name, "", frozenset()))
    except RecursionError:
        raise FormatError("the schema nests too deeply to be turned into a grammar") from None
    return name


class _Converter:
    def __init__(self, root: dict, rules: Rules | None = None) -> None:
        self.root = root
        self.rules = rules or Rules()
        self.refs: dict[str, str] = {}  # $ref -> its rule's name

    def grammar(self) -> str:
        root = self.rules.reserve("root")
        self._define(root, self.term(self.root, root, "", frozenset()))
        return self.rules.text()

    def _define(self, name: str, term: str) -> None:
        """``name`` (reserved) stands for ``term``; when ``term`` is the rule made under that
        same name (``Rules.add`` takes a reserved, undefined name) it already does."""
        if term != name:
            self.rules.define(name, term)

    # -- any schema ---------------------------------------------------------------------------

    def term(self, schema: Any, hint: str, path: str, heads: frozenset[str]) -> str:
        """A GBNF term for the values ``schema`` allows. ``heads``: the $refs being expanded
        since the last character the grammar writes (one of them again would be left
        recursion, which llama.cpp refuses)."""
        if schema is True or schema == {}:
            return self.rules.primitive("value")
        if schema is False:
            raise _error(path, "is false, which allows no value at all")
        if not isinstance(schema, dict):
            raise _error(path, "must be a JSON object (a schema)")
        unknown = [key for key in schema if key not in KNOWN]
        if unknown:
            raise _error(path, f"uses the keyword {unknown[0]!r}, which cannot be enforced; "
                               "remove it (README: Answers in a shape)")
        _check_checked_after(schema, path)
        if "$ref" in schema:
            return self.ref(schema, path, heads)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                return self.combination(schema, key, hint, path, heads)
        types = self.types(schema, path)
        if "const" in schema or "enum" in schema:
            return self.choices(schema, types, path)
        options = [self.typed(kind, schema, hint, path, heads) for kind in types]
        return alternatives(options) if options else self.rules.primitive("value")

    def types(self, schema: dict, path: str) -> list[str]:
        """The types ``schema`` allows: its ``type`` (one or a list), with null if ``nullable``;
        without one, what its keywords imply; [] for any value."""
        declared = schema.get("type")
        if declared is None:
            types = list(dict.fromkeys(IMPLIED_TYPES[k] for k in schema if k in IMPLIED_TYPES))
        else:
            types = [declared] if isinstance(declared, str) else declared
            if not isinstance(types, list) or not types:
                raise _error(path, "'type' must be a type name or a non-empty list of them")
            for kind in types:
                if kind not in TYPES:
                    raise _error(path, f"'type' {kind!r} is not a JSON Schema type "
                                       f"({', '.join(TYPES)})")
        if schema.get("nullable") is True and types and "null" not in types:
            types = [*types, "null"]
        return types

    def ref(self, schema: dict, path: str, heads: frozenset[str]) -> str:
        others = [k for k in schema if k != "$ref" and k not in ANNOTATIONS and k not in DEFINITIONS]
        if others:
            raise _error(path, f"has {others[0]!r} beside '$ref'; put the keywords in the "
                               "schema it points to")
        target = schema["$ref"]
        if not isinstance(target, str) or not target.startswith("#"):
            raise _error(path, f"'$ref' {target!r} points outside the schema; only references "
                               "inside it (#/$defs/name) are supported")
        if target in heads:
            raise _error(path, f"'$ref' {target!r} refers to itself before any value is written")
        name = self.refs.get(target)
        if name is None:
            resolved = resolve_pointer(self.root, target, path)
            name = self.refs[target] = self.rules.reserve(target.rsplit("/", 1)[-1] or "root-ref")
            self._define(name, self.term(resolved, name, target[1:], heads | {target}))
        return name

    def combination(self, schema: dict, key: str, hint: str, path: str,
                    heads: frozenset[str]) -> str:
        options = schema[key]
        where = f"{path}/{key}"
        if not isinstance(options, list) or not options:
            raise _error(path, f"'{key}' must be a non-empty list of schemas")
        others = [k for k in schema if k != key and k not in ANNOTATIONS and k not in DEFINITIONS]
        if others:
            raise _error(path, f"has {others[0]!r} beside {key!r}; put it inside each of "
                               f"the {key} schemas")
        if key == "allOf":
            if len(options) > 1:
                raise _error(path, "'allOf' with more than one schema cannot be enforced; "
                                   "merge them into one")
            return self.term(options[0], hint, f"{where}/0", heads)
        return alternatives([self.term(option, f"{hint}-{i}", f"{where}/{i}", heads)
                             for i, option in enumerate(options)])

    def choices(self, schema: dict, types: list[str], path: str) -> str:
        """``const`` or ``enum``: the values themselves, as compact JSON literals."""
        if "const" in schema:
            values, what = [schema["const"]], "'const'"
        else:
            values, what = schema["enum"], "'enum'"
            if not isinstance(values, list) or not values:
                raise _error(path, "'enum' must be a non-empty list of values")
        kept = [v for v in values if not types or any(is_type(v, kind) for kind in types)]
        if not kept:
            raise _error(path, f"{what} holds no value of its 'type' ({', '.join(types)})")
        return alternatives([literal(json.dumps(v, ensure_ascii=False, separators=(",", ":")))
                             for v in kept])

    def typed(self, kind: str, schema: dict, hint: str, path: str, heads: frozenset[str]) -> str:
        if kind == "object":
            return self.object(schema, hint, path)
        if kind == "array":
            return self.array(schema, hint, path)
        if kind == "string":
            return self.string(schema, hint, path)
        if kind == "integer":
            return self.integer(schema, hint, path)
        if kind == "number":
            low, _ = _numeric_bounds(schema, path)
            return self.rules.primitive("nonnegative-number" if low is not None and low >= 0
                                        else "number")
        return self.rules.primitive(kind)  # boolean, null

    # -- by type ------------------------------------------------------------------------------

    def string(self, schema: dict, hint: str, path: str) -> str:
        low, high = _length_bounds(schema, "minLength", "maxLength", path)
        form = schema.get("format")
        if form is not None and form not in FORMATS:
            raise _error(path, f"'format' {form!r} is not supported ({', '.join(FORMATS)})")
        if form in FORMATS_ENFORCED:
            return self.rules.add(f"{hint}-{form}", f'"\\"" {self.rules.primitive(form)} "\\""')
        if low == 0 and high is None:
            return self.rules.primitive("string")
        low, high = _grammar_counts(low, high)
        chars = repeat(self.rules.primitive("char"), low, high)
        return self.rules.add(f"{hint}-string", f'"\\"" {chars} "\\""')

    def integer(self, schema: dict, hint: str, path: str) -> str:
        low, high = _numeric_bounds(schema, path, integers=True)
        if low is None and high is None:
            return self.rules.primitive("integer")
        # Bounds longer than an integer's digits in the grammar are checked afterwards.
        low = None if low is None or abs(low) >= 10**MAX_DIGITS else int(low)
        high = None if high is None or abs(high) >= 10**MAX_DIGITS else int(high)
        if low is None and high is None:
            return self.rules.primitive("integer")
        return self.rules.add(f"{hint}-integer", integer_range(low, high))

    def object(self, schema: dict, hint: str, path: str) -> str:
        keys = ("properties", "required", "additionalProperties")
        if not any(k in schema for k in keys):
            return self.rules.primitive("object")
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise _error(path, "'properties' must be an object of schemas")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _error(path, "'required' must be a list of property names")
        extra = schema.get("additionalProperties")
        members = dict(properties)
        for name in required:
            if name not in members:
                if extra is False:
                    raise _error(path, f"requires {name!r}, which 'additionalProperties': false "
                                       "forbids (it is not among 'properties')")
                members[name] = extra if isinstance(extra, dict) else True
        ws = self.rules.primitive("ws")
        pairs: list[tuple[str, bool | None]] = []  # (member, required; None: any number)
        for name, value in members.items():
            if value is False and name in required:
                raise _error(f"{path}/properties/{_escape(name)}", "is false but required")
            if value is False:
                continue
            term = self.term(value, f"{hint}-{name}", f"{path}/properties/{_escape(name)}",
                             frozenset())
            key = literal(json.dumps(name, ensure_ascii=False))
            pairs.append((self.rules.add(f"{hint}-{name}-kv", f'{key} {ws} ":" {ws} {term} {ws}'),
                          name in required))
        if extra not in (None, False):
            value = self.term(True if extra is True else extra, f"{hint}-additional",
                              f"{path}/additionalProperties", frozenset())
            string = self.rules.primitive("string")
            pairs.append((self.rules.add(f"{hint}-additional-kv",
                                         f'{string} {ws} ":" {ws} {value} {ws}'), None))
        return self.rules.add(hint, f'"{{" {ws} {self._members(pairs, hint)} "}}"')

    def _members(self, pairs: list[tuple[str, bool | None]], hint: str) -> str:
        """The comma-separated members in order: ``True`` ones always, ``False`` ones maybe,
        ``None`` (additional properties, last) any number of times. Built from the end: each
        position has a term for "a member came before" (a comma first) and one for "none yet"
        (no comma; a later member may come first); either may be empty."""
        ws = self.rules.primitive("ws")
        after = first = ""  # the terms of the position after this one
        # Every member before position i is optional exactly while i <= the first that is not
        # (asked once: asking each position again made 30,000 properties a quadratic wait).
        first_not_optional = next((k for k, (_, required) in enumerate(pairs) if required is not False),
                                  len(pairs))
        for i in range(len(pairs) - 1, -1, -1):
            kv, required = pairs[i]
            comma_kv = f'"," {ws} {kv}'
            if required is None:
                after_i, first_i = f"( {comma_kv} )*", f"( {kv} ( {comma_kv} )* )?"
            elif required:
                after_i, first_i = f"{comma_kv} {after}", f"{kv} {after}"
            else:
                this = f"{kv} {after}".strip()
                after_i = f"( {comma_kv} )? {after}"
                first_i = f"( {this} | {first} )" if first else f"( {this} )?"
            if i == 0:
                return first_i.strip()
            # Named, so that each is written once however many positions before refer to it;
            # "none yet" is only reached while every member before it was left out.
            after = self.rules.add(f"{hint}-after-{i}", after_i.strip())
            first = (self.rules.add(f"{hint}-first-{i}", first_i.strip()) if i <= first_not_optional
                     else "")
        return ""

    def array(self, schema: dict, hint: str, path: str) -> str:
        low, high = _length_bounds(schema, "minItems", "maxItems", path)
        if not any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
            return self.rules.primitive("array")
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise _error(path, "'prefixItems' must be a list of schemas")
        if high is not None and high < len(prefix):
            raise _error(path, f"'maxItems' {high} is fewer than its {len(prefix)} 'prefixItems'")
        items = schema.get("items", not prefix)  # after a tuple, no more items unless asked
        if items is False and low > len(prefix):
            raise _error(path, f"'minItems' {low} asks for more items than it allows")
        ws = self.rules.primitive("ws")
        elements = [f"{self.term(p, f'{hint}-{i}', f'{path}/prefixItems/{i}', frozenset())} {ws}"
                    for i, p in enumerate(prefix)]
        body = f' "," {ws} '.join(elements)
        if items is not False:
            item = f"{self.term(items, f'{hint}-item', f'{path}/items', frozenset())} {ws}"
            more_low, more_high = _grammar_counts(
                max(0, low - len(prefix)), None if high is None else high - len(prefix))
            more = f'( "," {ws} {item} )'
            if elements:
                body += " " + repeat(more, more_low, more_high)
            elif more_high != 0:
                # The first item has no comma before it.
                rest = repeat(more, max(0, more_low - 1), None if more_high is None else more_high - 1)
                body = f"{item} {rest}" if more_low else f"( {item} {rest} )?"
        return self.rules.add(f"{hint}-array", f'"[" {ws} {body} "]"')


def resolve_pointer(root: dict, ref: str, path: str) -> Any:
    """The part of ``root`` that the local reference ``ref`` ("#/$defs/x") names."""
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _error(path, f"'$ref' {ref!r} points to nothing in the schema")
    return node


def _numeric_bounds(schema: dict, path: str, integers: bool = False) -> tuple[float | None, float | None]:
    """(lowest, highest) a number may be: inclusive for integers (exclusive bounds moved to the
    next integer), as given for numbers (an exclusive bound counts as its value). Checks that
    some number fits."""
    low = high = None
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = schema.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _error(path, f"{key!r} must be a number")
        if integers:
            value = {"minimum": math.ceil(value), "maximum": math.floor(value),
                     "exclusiveMinimum": math.floor(value) + 1,
                     "exclusiveMaximum": math.ceil(value) - 1}[key]
        if key.endswith("inimum"):
            low = value if low is None else max(low, value)
        else:
            high = value if high is None else min(high, value)
    exclusive = "exclusiveMinimum" in schema or "exclusiveMaximum" in schema
    if low is not None and high is not None and (low > high or (low == high and exclusive and not integers)):
        kind = "integer" if integers else "number"
        raise _error(path, f"allows no {kind}: the lowest allowed, {low}, is above the highest, {high}")
    return low, high


def _grammar_counts(low: int, high: int | None) -> tuple[int, int | None]:
    """The repetition counts the grammar enforces: llama.cpp unrolls ``x{m,n}`` into n rules,
    so counts above REPEAT_LIMIT are left to the check afterwards (a minimum is enforced up to
    the limit, a maximum above it not at all)."""
    return min(low, REPEAT_LIMIT), None if high is None or high > REPEAT_LIMIT else high


def _length_bounds(schema: dict, low_key: str, high_key: str, path: str) -> tuple[int, int | None]:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    for key, value in ((low_key, low), (high_key, high)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise _error(path, f"{key!r} must be a whole number of 0 or more")
    if high is not None and low > high:
        raise _error(path, f"{low_key!r} {low} is above {high_key!r} {high}")
    return low, high


def _check_checked_after(schema: dict, path: str) -> None:
    """The keywords only checked afterwards must still make sense now: a bad one would fail
    every answer, after the user waited for it."""
    if "pattern" in schema:
        _check_pattern(schema["pattern"], path)
    step = schema.get("multipleOf")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float))
                             or not math.isfinite(step) or step <= 0):
        raise _error(path, "'multipleOf' must be a number above 0")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise _error(path, "'uniqueItems' must be true or false")
    _length_bounds(schema, "minProperties", "maxProperties", path)


def _check_pattern(pattern: Any, path: str) -> None:
    if not isinstance(pattern, str):
        raise _error(path, "'pattern' must be a regular expression")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _error(path, f"'pattern' {pattern!r} is not a regular expression: {exc}") from None


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _error(path: str, problem: str) -> FormatError:
    """One line: "the schema at /properties/age uses ...", "the schema: 'minLength' 5 is ..."."""
    where = f"the schema at {path}" if path else "the schema"
    return FormatError(f"{where}: {problem}" if problem.startswith("'") else f"{where} {problem}")
