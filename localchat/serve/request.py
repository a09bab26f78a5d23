"""A chat request as the engine takes it, whichever API it came through, and the checks that turn
a client's JSON into one: every problem is an :class:`ApiError` (400) naming the field
(``messages[2].role``), never a traceback, and nothing in a request can name a file.

The OpenAI and Ollama modules read their own shapes with the checkers here (``field``,
``number``, ...) and build a :class:`ChatRequest`; the messages become the app's own
``{"role", "content"}`` dicts, laid out by the engine exactly as the app lays them out, and an
assistant message's ``tool_calls`` and ``tool`` results the chat history's shape
(``reply.calls.assistant_message``, ``ToolResult.to_message``; read by ``messages`` with
``tool_fields``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from localchat.engine.options import Sampling, shaped
from localchat.formats import AnswerFormat

ROLES = ("system", "user", "assistant", "tool")
MAX_STOPS = 16


class ApiError(Exception):
    """An answer that is an error: HTTP ``status`` and, in the API's own shape, a message for
    the user, the field at fault (``param``) and a machine-readable ``code``."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}


def bad(param: str, problem: str) -> ApiError:
    return ApiError(400, f"{param} {problem}", param=param)


@dataclass
class ChatRequest:
    """What to answer and how. ``None`` sampling values take the server's defaults."""

    model: str | None
    messages: list[dict[str, str]]
    stream: bool
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    thinking: str | None = None  # "on" | "off": the template's thinking switch
    include_usage: bool = False  # OpenAI stream_options.include_usage
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI function specs the model may call
    tool_choice: str = "auto"  # "auto" | "none" | "required" | a tool's name
    answer_format: AnswerFormat | None = None  # response_format / Ollama's format

    def sampling(self, defaults: Sampling) -> Sampling:
        given = {name: getattr(self, name) for name in (
            "max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
            "frequency_penalty", "presence_penalty", "seed", "thinking")}
        sampling = replace(defaults, **{k: v for k, v in given.items() if v is not None})
        return replace(shaped(sampling, self.answer_format), tools=self.tools,
                       tool_choice=self.tool_choice)


# -- reading JSON ------------------------------------------------------------------------------

def json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return value


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
