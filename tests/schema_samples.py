"""Random JSON Schemas of the class localchat enforces (nested objects, arrays with bounds,
enums, const, required and optional properties, integers with ranges, numbers, booleans, null
and nullable unions, strings with lengths and formats, $ref/$defs) and random valid instances of
them, written the ways a model may write JSON (compact, spaced, indented)."""

from __future__ import annotations

import datetime
import json
import random
import uuid
from typing import Any

ALPHABET = "abcxyz AZ09_-é中🙂\"\\/\n\t"


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A schema; at depth 0 an object with $defs that its properties may refer to."""
    if depth == 0:
        defs = {"point": {"type": "object",
                          "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
                          "required": ["x", "y"], "additionalProperties": False}}
        schema = _object(rng, depth)
        schema["$defs"] = defs
        return schema
    leaves = ["string", "integer", "range", "number", "boolean", "null", "enum", "const",
              "nullable", "date", "uuid", "ref", "short-string"]
    kind = rng.choice(leaves + (["object", "array", "anyOf"] if depth < 3 else []))
    if kind == "object":
        return _object(rng, depth)
    if kind == "array":
        low = rng.choice([0, 0, 1, 2])
        high = rng.choice([None, low, low + 1, low + 3])
        schema = {"type": "array", "items": random_schema(rng, depth + 1), "minItems": low}
        if high is not None:
            schema["maxItems"] = high
        return schema
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1), random_schema(rng, depth + 1)]}
    if kind == "range":
        low = rng.randint(-500, 500)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 2000)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 3, None, True, "a \"b\""], 3)}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False, None])}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer", "boolean"]), "null"]}
    if kind in ("date", "uuid"):
        return {"type": "string", "format": kind}
    if kind == "ref":
        return {"$ref": "#/$defs/point"}
    if kind == "short-string":
        return {"type": "string", "minLength": 1, "maxLength": rng.randint(1, 8)}
    return {"type": kind}


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(["name", "age", "tags", "ok", "score", "kind", "when", "id", "note"],
                       rng.randint(1, 5))
    properties = {name: random_schema(rng, depth + 1) for name in names}
    required = [name for name in names if rng.random() < 0.6]
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if rng.random() < 0.5:
        schema["additionalProperties"] = False
    return schema


def random_instance(rng: random.Random, schema: Any, root: dict[str, Any]) -> Any:
    """A value valid under ``schema`` that the schema's grammar also writes (properties in
    order, no extra ones)."""
    if "$ref" in schema:
        return random_instance(rng, root["$defs"][schema["$ref"].rsplit("/", 1)[-1]], root)
    if "anyOf" in schema:
        return random_instance(rng, rng.choice(schema["anyOf"]), root)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    kind = schema["type"]
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "object":
        return {name: random_instance(rng, sub, root) for name, sub in schema["properties"].items()
                if name in schema["required"] or rng.random() < 0.5}
    if kind == "array":
        high = schema.get("maxItems", schema["minItems"] + 3)
        return [random_instance(rng, schema["items"], root)
                for _ in range(rng.randint(schema["minItems"], high))]
    if kind == "string":
        if schema.get("format") == "date":
            return (datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randint(0, 20000))).isoformat()
        if schema.get("format") == "uuid":
            return str(uuid.UUID(int=rng.getrandbits(128)))
        length = rng.randint(schema.get("minLength", 0), schema.get("maxLength", 12))
        # Bounded lengths count escapes as one character each: no astral characters there
        # (ASCII-escaped they are two \u escapes).
        alphabet = ALPHABET if "maxLength" not in schema else ALPHABET.replace("🙂", "")
        return "".join(rng.choice(alphabet) for _ in range(length))
    if kind == "integer":
        return rng.randint(schema.get("minimum", -10**6), schema.get("maximum", 10**6))
    if kind == "number":
        return rng.choice([rng.randint(-50, 50), round(rng.uniform(-1e4, 1e4), 4), 1.5e-7, 2e20])
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def written(rng: random.Random, value: Any) -> str:
    """``value`` as JSON, in one of the ways models write it."""
    style = rng.choice(["compact", "spaced", "indented"])
    if style == "compact":
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if style == "spaced":
        return json.dumps(value, ensure_ascii=rng.random() < 0.5)
    return json.dumps(value, ensure_ascii=False, indent=2)
