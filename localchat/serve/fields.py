"""The checks that turn a client's JSON into Python values: every problem is a 400
(``http_errors.BadRequest``) naming the field (``messages[2].role``, ``options.top_k``), never a
traceback. Both APIs read their own shapes with these (``openai_api``, ``ollama_api``,
``chat_request``, ``request_messages``, ``tool_fields``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from localchat.serve.http_errors import BadRequest, bad

MAX_STOPS = 16


def json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(body):
        try:
            _refuse_lone_surrogates(value, "")
        except RecursionError:
            raise BadRequest("the request body is nested too deeply") from None
    return value


# A JSON escape of a UTF-16 surrogate. A pair decodes to one character; half of one (what
# JavaScript sends after cutting a string inside an emoji) stays a lone surrogate, which no
# UTF-8 text can hold: the tokenizer would fail on it (a 500), so it is the client's 400.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_lone_surrogates(value: Any, where: str) -> None:
    """A 400 naming the first string (or key) in ``value`` that holds a lone surrogate."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            raise bad(where or "the request body", f"holds a lone UTF-16 surrogate "
                      f"(\\u{ord(found.group()):04x} at character {found.start()}): the text was "
                      "cut inside a character; send whole characters")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key, where)
            _refuse_lone_surrogates(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_lone_surrogates(item, f"{where}[{i}]")


_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number",
          list: "an array", dict: "an object"}


def field_of(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """``obj[key]`` if it has the type ``kind`` (None when absent or null); else a 400."""
    value = obj.get(key)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(_is(value, k) for k in kinds)
    if not ok:
        names = " or ".join(_NAMES.get(k, k.__name__) for k in kinds)
        raise bad(where + key, f"must be {names}, not {shown(value)}")
    return value


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number(obj: dict[str, Any], key: str, low: float, high: float, where: str = "") -> float | None:
    value = field_of(obj, key, float, where)
    if value is not None and not low <= value <= high:
        raise bad(where + key, f"must be between {low:g} and {high:g}, not {value}")
    return None if value is None else float(value)


def integer(obj: dict[str, Any], key: str, low: int, where: str = "",
            high: int | None = None) -> int | None:
    value = field_of(obj, key, int, where)
    if value is not None and (value < low or (high is not None and value > high)):
        limit = f"at least {low}" if high is None else f"between {low} and {high}"
        raise bad(where + key, f"must be {limit}, not {value}")
    return value


def stops(obj: dict[str, Any], key: str, where: str = "") -> list[str]:
    """A stop string or a list of them (empty strings dropped)."""
    value = field_of(obj, key, (str, list), where)
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if len(items) > MAX_STOPS:
        raise bad(where + key, f"may hold at most {MAX_STOPS} strings, not {len(items)}")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise bad(f"{where}{key}[{i}]", f"must be a string, not {shown(item)}")
    return [item for item in items if item]


def thinking_switch(value: Any, param: str) -> str | None:
    """A request's thinking switch (true/false, or Ollama's effort words) as on/off."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value in ("low", "medium", "high"):
        return "on"
    raise bad(param, f"must be true or false, not {shown(value)}")
