"""How large a JSON Schema may be to be turned into a grammar, for a schema that comes from the
network (``localchat serve``'s ``response_format``, Ollama's ``format``, a tool's parameters):
a 1 MB schema of 30,000 optional properties took seconds to convert (the time grows with the
square of an object's properties) and made a grammar of megabytes. ``schema_size_problem``
counts before anything is converted, in one pass that stops at the first limit.

The limits are OpenAI's own for structured outputs (5,000 properties in all), and a bound on
the schema's values that no real schema comes near.
"""

from __future__ import annotations

from typing import Any

MAX_PROPERTIES = 5_000  # object properties in the whole schema (OpenAI's limit)
MAX_VALUES = 100_000  # JSON values in the whole schema: keywords, subschemas, enum values...


def schema_size_problem(schema: Any) -> str | None:
    """None when ``schema`` is within the limits; else one line: "the schema has 30,000
    properties; at most 5,000". Walks without recursion (a deep schema is the converter's to
    refuse) and stops once the values are over their limit."""
    properties = values = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        values += 1
        if values > MAX_VALUES:
            return f"the schema holds over {MAX_VALUES:,} values; at most {MAX_VALUES:,}"
        if isinstance(node, dict):
            named = node.get("properties")
            if isinstance(named, dict):  # its values are schemas, its keys names
                properties += len(named)
                stack.extend(named.values())
            stack.extend(value for key, value in node.items()
                         if key != "properties" or not isinstance(named, dict))
        elif isinstance(node, list):
            stack.extend(node)
    if properties > MAX_PROPERTIES:
        return f"the schema has {properties:,} properties; at most {MAX_PROPERTIES:,}"
    return None
