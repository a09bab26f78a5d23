"""A call's arguments against the tool's input schema, checked before anything runs.

The model (a small local one, or a remote one that may send anything) can call a tool with
arguments of the wrong type, a missing required one, or extras. They are checked with
``jsonschema`` against the schema the tool declared, and the first problem (the one jsonschema
judges most relevant) is written for the model to correct. A tool whose own schema is not valid
JSON Schema, or defeats the checker, is left to judge its arguments itself.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from typing import Any

log = logging.getLogger("localchat.tools.schema")

MESSAGE_CHARS = 300  # jsonschema quotes the offending value: a 10 MB string must not come back


def arguments_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit ``schema``, in one line, or None when they do."""
    if not schema:
        return None
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
        if validator is None:
            return None
        from jsonschema.exceptions import best_match

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
    return f"{message} (at {where})" if where else message


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)
