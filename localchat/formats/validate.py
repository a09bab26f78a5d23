"""JSON values against a JSON Schema, with ``jsonschema``: a finished answer, and a tool call's
arguments before the tool runs.

- ``schema_problem(value, schema)``: None for a valid answer, else one line that says where and
  why it is not (``at /tags/2: ...``). The schema has passed ``schema_grammar`` first, so its
  keywords are those ``formats.keywords`` accepts, the ones the grammar enforces too (an answer
  from a remote model, or one a grammar let through under REPEAT_LIMIT, is checked the same
  way). It is read as draft 2020-12 whatever its ``$schema``, with what the grammar side also
  takes: OpenAPI's ``nullable``, ``multipleOf`` on decimals as a person means it (0.3 is a
  multiple of 0.1), and the string formats of ``formats.keywords`` (dates against the calendar).
  The problem shown is the first one found nearest the top of the value.
- ``arguments_problem(schema, arguments)``: why a tool call's arguments do not fit the input
  schema the tool declared, as jsonschema words it (the one it judges most relevant), for the
  model to correct. Any draft the schema names; a schema that is not valid JSON Schema, or
  defeats the checker, leaves the tool to judge its arguments itself.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from localchat.formats.bounded_regex import SEARCH_S, Budget, budget, install_in_jsonschema
from localchat.formats.keywords import FORMATS

if TYPE_CHECKING:
    from jsonschema import FormatChecker, ValidationError
    from jsonschema.protocols import Validator

log = logging.getLogger("localchat.formats.validate")

MESSAGE_CHARS = 300  # jsonschema quotes the offending value: a 10 MB string must not come back


def schema_problem(value: Any, schema: Any) -> str | None:
    """None if ``value`` (parsed JSON) is valid under ``schema``; else the first problem. Its
    patterns run with a bound (``formats.bounded_regex``): one too slow to check is said."""
    validator = _answer_validator(json.dumps(schema))
    with budget() as patterns:
        found = [(len(error.absolute_path), n, error)
                 for n, error in enumerate(validator.iter_errors(value))]
    if not found:
        return None
    error = min(found, key=lambda item: item[:2])[2]
    where = "".join(f"/{part}" for part in error.absolute_path) or "/"
    return f"at {where}: {_words(error, validator)}{_too_slow(patterns)}"


def _too_slow(patterns: Budget) -> str:
    if patterns.gave_up is None:
        return ""
    shown = patterns.gave_up if len(patterns.gave_up) <= 80 else patterns.gave_up[:79] + "…"
    return (f" (the pattern {shown!r} took too long to check: over "
            f"{SEARCH_S:g} s, counted as no match)")


def arguments_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit ``schema``, in one line, or None when they do."""
    if not schema:
        return None
    try:
        validator = _arguments_validator(json.dumps(schema, sort_keys=True))
        if validator is None:
            return None
        from jsonschema.exceptions import best_match

        with budget() as patterns:
            error = best_match(validator.iter_errors(arguments))
    except Exception:  # a schema that defeats the checker (a $ref loop, unknown $refs)
        log.warning("could not check arguments against a tool's input schema", exc_info=True)
        return None
    if error is None:
        return None
    message = error.message
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS - 1] + "…"
    where = "/".join(str(part) for part in error.absolute_path)
    return (f"{message} (at {where})" if where else message) + _too_slow(patterns)


def is_type(value: Any, kind: str) -> bool:
    """Whether a parsed JSON value is of the JSON Schema type ``kind``, as jsonschema's draft
    2020-12 has it (1.0 is an integer, true is no number): for the grammar side, which must not
    wait for jsonschema's import (a schema becomes a grammar within ``bench --schema``'s 50 ms)."""
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


# -- the answer validator: draft 2020-12 and what the grammar side takes besides -----------------
# jsonschema is imported on first use: it costs a tenth of a second, and most runs check nothing.

def _declared_types(schema: dict[str, Any]) -> list[str]:
    declared = schema["type"]
    kinds = [declared] if isinstance(declared, str) else list(declared)
    return [*kinds, "null"] if schema.get("nullable") is True else kinds


def _type(validator: Validator, declared: Any, value: Any,
          schema: dict[str, Any]) -> Iterator[ValidationError]:
    from jsonschema import ValidationError

    if not any(validator.is_type(value, kind) for kind in _declared_types(schema)):
        yield ValidationError("wrong type")  # worded by _words


def _multiple_of(validator: Validator, step: float, value: Any,
                 schema: dict[str, Any]) -> Iterator[ValidationError]:
    from jsonschema import ValidationError

    if validator.is_type(value, "number") and step > 0:
        quotient = value / step
        if not math.isclose(quotient, round(quotient), rel_tol=1e-9, abs_tol=1e-9):
            yield ValidationError("not a multiple")  # worded by _words


def _properties(validator: Validator, properties: dict[str, Any], value: Any,
                schema: dict[str, Any]) -> Iterator[ValidationError]:
    """Draft 2020-12's, except that a property declared ``false`` is named: jsonschema reports a
    false schema without saying where it was."""
    from jsonschema import ValidationError

    if not validator.is_type(value, "object"):
        return
    for name, sub in properties.items():
        if name in value and sub is False:
            yield ValidationError(f"the property {name!r} is not allowed")
        elif name in value:
            yield from validator.descend(value[name], sub, path=name, schema_path=name)


def _is_date(text: str) -> bool:
    return bool(re.fullmatch(r"\d{4}-\d\d-\d\d", text)) and _parses(datetime.date.fromisoformat, text)


def _is_time(text: str) -> bool:
    return bool(re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)",
                             text))


def _parses(parse: Any, text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


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
assert set(_FORMAT_CHECKS) == set(FORMATS)


def _format_checker() -> FormatChecker:
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    for name, check in _FORMAT_CHECKS.items():
        checker.checks(name)(lambda value, check=check: not isinstance(value, str) or check(value))
    return checker


@lru_cache(maxsize=1)
def _answer_validator_class() -> tuple[type[Validator], FormatChecker]:
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    install_in_jsonschema()
    keywords = {"type": _type, "multipleOf": _multiple_of, "properties": _properties}
    return extend(Draft202012Validator, keywords), _format_checker()


@lru_cache(maxsize=64)
def _answer_validator(schema_json: str) -> Validator:
    cls, formats = _answer_validator_class()
    return cls(json.loads(schema_json), format_checker=formats)


@lru_cache(maxsize=256)
def _arguments_validator(schema_json: str) -> Validator | None:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    install_in_jsonschema()
    schema = json.loads(schema_json)
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    validator: Validator = cls(schema)
    return validator


# -- an answer's problem in words ----------------------------------------------------------------

def _words(error: ValidationError, validator: Validator) -> str:
    """What is wrong, in the words localchat shows (jsonschema's own quote Python values)."""
    keyword, limit, value = error.validator, error.validator_value, error.instance
    schema = error.schema if isinstance(error.schema, dict) else {}
    shown = _show(value)
    if keyword is None:  # a false schema
        return "no value is allowed here"
    if keyword == "type":
        return f"{shown} is not of type {' or '.join(_declared_types(schema))}"
    if keyword == "required":
        missing = next(name for name in limit if name not in value)
        return f"the required property {missing!r} is missing"
    if keyword == "additionalProperties":
        extra = next(name for name in value if name not in schema.get("properties", {}))
        return f"the property {extra!r} is not allowed"
    if keyword == "items":
        return f"the array has more than {len(schema.get('prefixItems', []))} items"
    if keyword == "uniqueItems":
        twice = next(item for i, item in enumerate(value)
                     if any(json_equal(item, other) for other in value[:i]))
        return f"the item {_show(twice)} appears twice (uniqueItems)"
    if keyword == "oneOf":
        matching = sum(validator.evolve(schema=sub).is_valid(value) for sub in limit)
        return f"{shown} matches {matching} of the 'oneOf' schemas, not one"
    words = _WORDS.get(str(keyword))
    return words(shown, limit) if words else error.message


_WORDS: dict[str, Callable[[str, Any], str]] = {
    "anyOf": lambda shown, limit: f"{shown} matches none of the 'anyOf' schemas",
    "const": lambda shown, limit: f"{shown} is not the constant {_show(limit)}",
    "enum": lambda shown, limit: f"{shown} is not one of {_show(limit)}",
    "minLength": lambda shown, limit: f"{shown} is shorter than {limit} characters",
    "maxLength": lambda shown, limit: f"{shown} is longer than {limit} characters",
    "pattern": lambda shown, limit: f"{shown} does not match the pattern {limit!r}",
    "format": lambda shown, limit: f"{shown} is not a valid {limit}",
    "minimum": lambda shown, limit: f"{shown} is less than the minimum {limit}",
    "maximum": lambda shown, limit: f"{shown} is greater than the maximum {limit}",
    "exclusiveMinimum": lambda shown, limit: f"{shown} is not above the exclusive minimum {limit}",
    "exclusiveMaximum": lambda shown, limit: f"{shown} is not below the exclusive maximum {limit}",
    "multipleOf": lambda shown, limit: f"{shown} is not a multiple of {limit}",
    "minProperties": lambda shown, limit: f"the object has fewer than {limit} properties",
    "maxProperties": lambda shown, limit: f"the object has more than {limit} properties",
    "minItems": lambda shown, limit: f"the array has fewer than {limit} items",
    "maxItems": lambda shown, limit: f"the array has more than {limit} items",
}


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
