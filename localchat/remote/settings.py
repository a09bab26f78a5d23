"""The ``[remote]`` section of config.toml, validated once into a :class:`RemoteSettings`.

Example::

    [remote]
    mode = "auto"                      # "off" (default) | "ask" | "auto"
    base_url = "http://127.0.0.1:8000/v1"
    model = "qwen2.5-72b-instruct"
    api_key_env = "LOCALCHAT_REMOTE_API_KEY"   # the variable's *name*; its value is never stored
    timeout_s = 30

The API key is read from the environment when a request is built (:meth:`RemoteSettings.api_key`)
and is never kept on this object, so it cannot end up in a repr, a log line or a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from localchat.errors import ConfigError

Mode = Literal["off", "ask", "auto"]
MODES: tuple[str, ...] = ("off", "ask", "auto")


@dataclass(frozen=True)
class RouterThresholds:
    """When the rules send a prompt to the remote before any local generation (mode ``auto``)."""

    # Sum of the rule weights (see router.py) at or above which a prompt is called hard. None
    # (the default): a function of the local model's parameter count (router.rule_score_for).
    rule_score: float | None = None
    # The prompt is "too long for the local model" above this share of the local room.
    local_fit_fraction: float = 1.0


@dataclass(frozen=True)
class ConfidenceThresholds:
    """When a local reply is stopped and handed to the remote (mode ``auto``)."""

    # The window: confidence is judged over this many tokens that carry numbers (the engine
    # gives them for the reply's first EngineOptions.confidence_tokens, 32 by default).
    min_tokens: int = 16
    # Escalate when the window's mean entropy (nats) is above max_entropy, or its mean top-2
    # margin below min_margin; for other model sizes they are scaled by confidence.scaled().
    # Calibrated on SmolLM2-135M over the two labelled sets (147 prompts, greedy and default
    # sampling, 16-token windows within the first 32 tokens): the start's entropy does not tell
    # hard from easy prompts there (median of the worst window: 1.8 nats hard, 2.2 easy; creative
    # easy prompts such as a haiku run highest), so these fire only on outright guessing: on 0
    # to 3 of the 78 easy prompts per decoding mode (at 3.0 nats: 8 to 10).
    max_entropy: float = 3.75
    min_margin: float = 0.15
    quantile: float = 0.1  # which low quantile of the token probabilities to watch
    # Escalate when that quantile falls below this; 0 (the default) turns the rule off. Over the
    # whole reply at 0.01 it fired only on outright guessing, but the engine now scores just the
    # first 32 tokens, and the p10 of 16 sampled-token probabilities is the second-lowest: at
    # temperature 0.7 one unlucky draw sends an easy reply away (5 of 26 easy held-out prompts,
    # SmolLM2-135M), while entropy and margin describe the distribution, not the draw.
    low_prob: float = 0.0
    escalate_on_length: bool = True  # a reply cut by max_tokens
    escalate_on_loop: bool = True  # a reply stuck repeating itself
    loop_min_chars: int = 48  # a loop must cover at least this many characters...
    loop_min_repeats: int = 3  # ...made of at least this many copies of one unit


@dataclass(frozen=True)
class RemoteSettings:
    """Everything the remote client, the breaker and the router need. Immutable."""

    mode: Mode = "off"
    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    timeout_s: float = 30.0  # connect timeout, and the longest silence allowed mid-stream
    # Budget for the conversation sent to the remote, estimated from characters (see context.py).
    max_context_tokens: int = 8192
    max_tokens: int | None = None  # None: use the local sampling's max_tokens
    breaker_failures: int = 3  # consecutive failed turns that mark the remote down...
    breaker_cooldown_s: float = 120.0  # ...for this long
    router: RouterThresholds = field(default_factory=RouterThresholds)
    confidence: ConfidenceThresholds = field(default_factory=ConfidenceThresholds)

    @property
    def enabled(self) -> bool:
        """True when requests may be made at all: a mode other than "off" and a base URL."""
        return self.mode != "off" and bool(self.base_url)

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def api_key(self) -> str | None:
        """The key from the environment, read now; None when no variable is named or it is unset."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    @classmethod
    def from_config(cls, section: dict[str, Any] | None) -> RemoteSettings:
        """Build settings from the ``[remote]`` table (a dict as parsed from TOML).

        Router and confidence thresholds may be given flat (``rule_score = 2.5``,
        ``low_prob = 0.1``) or in the sub-tables ``[remote.router]`` / ``[remote.confidence]``.
        Keys this module does not know are ignored (the config sections are open).
        Raises :class:`ConfigError` with a one-line message for a bad value, and for an ``api_key``
        key: the key itself must live in the environment, never in the file.
        """
        section = dict(section or {})
        if "api_key" in section:
            raise ConfigError(
                "[remote] api_key: do not put the key in config.toml; set an environment variable "
                "and name it with api_key_env"
            )
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("router", "confidence") or f.name not in section:
                continue
            values[f.name] = _checked(f.name, section[f.name], _TOP_LEVEL_TYPES[f.name])
        mode = values.get("mode", "off")
        if mode not in MODES:
            raise ConfigError(f'[remote] mode: expected "off", "ask" or "auto", got {mode!r}')
        values["router"] = _sub_settings(RouterThresholds, section, "router")
        values["confidence"] = _sub_settings(ConfidenceThresholds, section, "confidence")
        settings = cls(**values)
        _check_ranges(settings)
        return settings


_TOP_LEVEL_TYPES: dict[str, tuple[type, ...]] = {
    "mode": (str,),
    "base_url": (str,),
    "model": (str,),
    "api_key_env": (str,),
    "timeout_s": (int, float),
    "max_context_tokens": (int,),
    "max_tokens": (int,),
    "breaker_failures": (int,),
    "breaker_cooldown_s": (int, float),
}


# Threshold fields are annotated bool, int or float (strings, with postponed annotations).
_KINDS_BY_ANNOTATION: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,)}


def _sub_settings(cls: type, section: dict[str, Any], table: str) -> Any:
    nested = section.get(table, {})
    if not isinstance(nested, dict):
        raise ConfigError(f"[remote] {table}: expected a table ([remote.{table}])")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in nested:
            raw, where = nested[f.name], f"{table}.{f.name}"
        elif f.name in section:
            raw, where = section[f.name], f.name
        else:
            continue
        kinds = _KINDS_BY_ANNOTATION.get(str(f.type), (int, float))
        values[f.name] = _checked(where, raw, kinds)
    return cls(**values)


def _checked(key: str, value: Any, kinds: tuple[type, ...]) -> Any:
    # TOML booleans are ints in Python; a number key must not silently accept true/false.
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        expected = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"[remote] {key}: expected {expected}, got {value!r}")
    return float(value) if float in kinds and not isinstance(value, bool) else value


def _check_ranges(s: RemoteSettings) -> None:
    problems = []
    if s.base_url and not s.base_url.startswith(("http://", "https://")):
        problems.append(f"base_url must start with http:// or https://, got {s.base_url!r}")
    elif s.base_url:
        problem = _url_problem(s.base_url)
        if problem:
            problems.append(f"base_url {s.base_url!r} is not a usable URL: {problem}")
    if s.timeout_s <= 0:
        problems.append("timeout_s must be positive")
    if s.max_context_tokens < 256:
        problems.append("max_context_tokens must be at least 256")
    if s.max_tokens is not None and s.max_tokens < 1:
        problems.append("max_tokens must be at least 1")
    if s.breaker_failures < 1:
        problems.append("breaker_failures must be at least 1")
    if not 0.0 < s.confidence.quantile < 1.0:
        problems.append("confidence quantile must be between 0 and 1")
    if not 0.0 <= s.confidence.low_prob <= 1.0:
        problems.append("confidence low_prob must be between 0 and 1")
    if not 0.0 <= s.confidence.min_margin <= 1.0:
        problems.append("confidence min_margin must be between 0 and 1")
    if s.confidence.max_entropy <= 0.0:
        problems.append("confidence max_entropy must be positive")
    if s.confidence.min_tokens < 1:
        problems.append("confidence min_tokens must be at least 1")
    if s.router.rule_score is not None and s.router.rule_score <= 0.0:
        problems.append("router rule_score must be positive")
    if problems:
        raise ConfigError(f"[remote] {problems[0]}")


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be connected to (a port out of range, no host), else None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for "Port out of range" or a non-number
    except ValueError as exc:
        return str(exc).lower()
    if not parts.hostname:
        return "no host name"
    return None
