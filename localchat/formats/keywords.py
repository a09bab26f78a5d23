"""Which JSON Schema keywords localchat takes, and what it does with each: enforced while the
answer is sampled (the grammar cannot produce anything else), checked afterwards (the answer is
validated when it is complete; a violation makes it invalid), or only read as documentation.
Any other keyword is refused with one line before a model loads: a constraint that is silently
ignored would let through answers the user asked to exclude.

README's "Answers in a shape" section is written from these sets.
"""

from __future__ import annotations

# Enforced while sampling.
ENFORCED = frozenset({
    "type", "nullable",  # nullable: OpenAPI 3.0's spelling of "or null"
    "properties", "required", "additionalProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf",
    "$ref", "$defs", "definitions",
    "minLength", "maxLength", "format",
    # For integers; for numbers they are checked afterwards (a minimum of 0 or more still
    # keeps the minus sign out while sampling).
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
})

# Checked afterwards only.
CHECKED_AFTER = frozenset({"pattern", "multipleOf", "uniqueItems", "minProperties", "maxProperties"})

# Documentation for the model and the reader: no effect on the answer.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$anchor", "$comment",
    "readOnly", "writeOnly", "deprecated", "contentMediaType",
})

KNOWN = ENFORCED | CHECKED_AFTER | ANNOTATIONS

# String formats: those with a grammar are enforced while sampling (and their dates checked for
# the calendar afterwards), the others are strings checked afterwards.
FORMATS_ENFORCED = ("date", "time", "date-time", "uuid")
FORMATS_CHECKED = ("email", "hostname", "ipv4", "ipv6", "uri")
FORMATS = FORMATS_ENFORCED + FORMATS_CHECKED

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")

# Keywords that imply a type when a schema names none.
IMPLIED_TYPES = {
    "properties": "object", "required": "object", "additionalProperties": "object",
    "minProperties": "object", "maxProperties": "object",
    "items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array",
    "uniqueItems": "array",
    "minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
    "exclusiveMaximum": "number", "multipleOf": "number",
}
