"""simonw/llm's short form of a schema: ``'name, age int, bio: one line'``.

Fields are separated by commas, or by newlines when there is one (then a description may hold
commas). Each field is a name, an optional type (``int``, ``float``, ``str``, ``bool``; ``str``
when none is given) and an optional description after a colon. Every field is required. With
``multi`` the object is wrapped as ``{"items": [...]}``, llm's ``--schema-multi``.

Stricter than llm where llm guesses: an unknown type word, a field without a name, a name given
twice and an empty short form are refused (FormatError) instead of read as strings or dropped.
"""

from __future__ import annotations

from typing import Any

from localchat.errors import FormatError

TYPE_WORDS = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


def short_form_schema(text: str, multi: bool = False) -> dict[str, Any]:
    """The JSON Schema of the short form ``text``."""
    separator = "\n" if "\n" in text else ","
    fields = [field.strip() for field in text.split(separator) if field.strip()]
    if not fields:
        raise FormatError("the schema is empty: give fields such as 'name, age int, bio: one line'")
    properties: dict[str, Any] = {}
    for field in fields:
        spec, _, description = field.partition(":")
        words = spec.split()
        if not words:
            raise FormatError(f"the schema field {field!r} has no name (short form: "
                              "'name type: description')")
        if len(words) > 2:
            raise FormatError(f"the schema field {spec.strip()!r} has more than a name and a "
                              "type; put a description after ':'")
        name = words[0]
        kind = words[1] if len(words) == 2 else "str"
        if kind not in TYPE_WORDS:
            raise FormatError(f"the schema field {name!r} has the type {kind!r}; use one of "
                              f"{', '.join(TYPE_WORDS)}")
        if name in properties:
            raise FormatError(f"the schema names the field {name!r} twice")
        properties[name] = {"type": TYPE_WORDS[kind]}
        if description.strip():
            properties[name]["description"] = description.strip()
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "required": list(properties)}
    return multi_schema(schema) if multi else schema


def multi_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as a list of such objects, under the key ``items`` (llm's ``--schema-multi``)."""
    return {"type": "object", "properties": {"items": {"type": "array", "items": schema}},
            "required": ["items"]}
