"""Checking a finished answer against its JSON Schema: ``schema_problem(value, schema)`` is None
for a valid value, else one line that says where and why it is not.

It covers every keyword ``formats.keywords`` accepts, the ones the grammar enforces too (an
answer from a remote model, or one a grammar let through under REPEAT_LIMIT, is checked the same
way), and it assumes the schema passed ``schema_grammar`` (a refused schema never gets here).
Written here rather than taken from the ``jsonschema`` package: the keywords checked must be
exactly those the grammar side accepts, no more, and the four packages it brings (one of them
compiled) would be there for ~150 lines.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit


def schema_problem(value: Any, schema: Any, root: Any = None) -> str | None:
    """None if ``value`` (parsed JSON) is valid under ``schema``; else the first problem."""
    return _Check(schema if root is None else root).problem(value, schema, "")


def is_type(value: Any, kind: str) -> bool:
    """Whether a parsed JSON value is of the JSON Schema type ``kind``."""
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    return kind == "object" and isinstance(value, dict)


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, but true is not 1 (as Python's == would have it)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_type(a, "number") and is_type(b, "number"):
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and bool(a == b)


def _is_date(text: str) -> bool:
    return bool(re.fullmatch(r"\d{4}-\d\d-\d\d", text)) and _parses(datetime.date.fromisoformat, text)


def _is_time(text: str) -> bool:
    return bool(re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)",
                             text))


_FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "date": _is_date,
    "time": _is_time,
    "date-time": lambda s: len(s) > 10 and s[10] in "Tt" and _is_date(s[:10]) and _is_time(s[11:]),
    "uuid": lambda s: bool(re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", s)),
    "email": lambda s: bool(re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", s)),
    "hostname": lambda s: len(s) <= 253 and all(
        re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", part) for part in s.split(".")),
    "ipv4": lambda s: bool(re.fullmatch(r"[\d.]+", s)) and _parses(ipaddress.IPv4Address, s),
    "ipv6": lambda s: _parses(ipaddress.IPv6Address, s),
    "uri": lambda s: bool(urlsplit(s).scheme) and not any(c.isspace() for c in s),
}


def _parses(parse: Any, text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


class _Check:
    def __init__(self, root: Any) -> None:
        self.root = root

    def problem(self, value: Any, schema: Any, at: str) -> str | None:
        if schema is True or schema is None:
            return None
        if schema is False:
            return _at(at, "no value is allowed here")
        if "$ref" in schema:
            return self.problem(value, self._resolve(schema["$ref"]), at)
        for check in (self._combinations, self._choices, self._type):
            found = check(value, schema, at)
            if found:
                return found
        if isinstance(value, str):
            return self._string(value, schema, at)
        if is_type(value, "number"):
            return self._number(value, schema, at)
        if isinstance(value, dict):
            return self._object(value, schema, at)
        if isinstance(value, list):
            return self._array(value, schema, at)
        return None

    def _resolve(self, ref: str) -> Any:
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def _combinations(self, value: Any, schema: dict, at: str) -> str | None:
        for sub in schema.get("allOf", []):
            found = self.problem(value, sub, at)
            if found:
                return found
        if "anyOf" in schema and all(self.problem(value, s, at) for s in schema["anyOf"]):
            return _at(at, f"{_show(value)} matches none of the 'anyOf' schemas")
        if "oneOf" in schema:
            matching = sum(self.problem(value, s, at) is None for s in schema["oneOf"])
            if matching != 1:
                return _at(at, f"{_show(value)} matches {matching} of the 'oneOf' schemas, not one")
        return None

    def _choices(self, value: Any, schema: dict, at: str) -> str | None:
        if "const" in schema and not json_equal(value, schema["const"]):
            return _at(at, f"{_show(value)} is not the constant {_show(schema['const'])}")
        if "enum" in schema and not any(json_equal(value, v) for v in schema["enum"]):
            return _at(at, f"{_show(value)} is not one of {_show(schema['enum'])}")
        return None

    def _type(self, value: Any, schema: dict, at: str) -> str | None:
        declared = schema.get("type")
        if declared is None:
            return None
        kinds = [declared] if isinstance(declared, str) else list(declared)
        if schema.get("nullable") is True:
            kinds.append("null")
        if not any(is_type(value, kind) for kind in kinds):
            return _at(at, f"{_show(value)} is not of type {' or '.join(kinds)}")
        return None

    def _string(self, value: str, schema: dict, at: str) -> str | None:
        if len(value) < schema.get("minLength", 0):
            return _at(at, f"{_show(value)} is shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return _at(at, f"{_show(value)} is longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return _at(at, f"{_show(value)} does not match the pattern {schema['pattern']!r}")
        check = _FORMAT_CHECKS.get(schema.get("format", ""))
        if check is not None and not check(value):
            return _at(at, f"{_show(value)} is not a valid {schema['format']}")
        return None

    def _number(self, value: float, schema: dict, at: str) -> str | None:
        bounds = (("minimum", lambda lim: value < lim, "less than the minimum"),
                  ("maximum", lambda lim: value > lim, "greater than the maximum"),
                  ("exclusiveMinimum", lambda lim: value <= lim, "not above the exclusive minimum"),
                  ("exclusiveMaximum", lambda lim: value >= lim, "not below the exclusive maximum"))
        for key, broken, words in bounds:
            if key in schema and broken(schema[key]):
                return _at(at, f"{_show(value)} is {words} {schema[key]}")
        step = schema.get("multipleOf")
        if step is not None and not _is_multiple(value, step):
            return _at(at, f"{_show(value)} is not a multiple of {step}")
        return None

    def _object(self, value: dict, schema: dict, at: str) -> str | None:
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                return _at(at, f"the required property {name!r} is missing")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            sub = properties.get(name, extra)
            if sub is False:
                return _at(at, f"the property {name!r} is not allowed")
            found = self.problem(item, sub, f"{at}/{name}")
            if found:
                return found
        for key, broken, words in (("minProperties", lambda n: len(value) < n, "fewer"),
                                   ("maxProperties", lambda n: len(value) > n, "more")):
            if key in schema and broken(schema[key]):
                return _at(at, f"the object has {words} than {schema[key]} properties")
        return None

    def _array(self, value: list, schema: dict, at: str) -> str | None:
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else items
            if sub is False:
                return _at(at, f"the array has more than {len(prefix)} items")
            found = self.problem(item, sub, f"{at}/{i}")
            if found:
                return found
        if len(value) < schema.get("minItems", 0):
            return _at(at, f"the array has fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return _at(at, f"the array has more than {schema['maxItems']} items")
        if schema.get("uniqueItems") is True:
            for i, item in enumerate(value):
                if any(json_equal(item, other) for other in value[:i]):
                    return _at(at, f"the item {_show(item)} appears twice (uniqueItems)")
        return None


def _is_multiple(value: float, step: float) -> bool:
    if step <= 0:
        return True
    quotient = value / step
    return math.isclose(quotient, round(quotient), rel_tol=1e-9, abs_tol=1e-9)


def _show(value: Any) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _at(at: str, problem: str) -> str:
    return f"at {at or '/'}: {problem}"
