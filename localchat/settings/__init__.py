"""User settings: ``config.toml`` in the config dir (``LOCALCHAT_HOME/config.toml``).

A missing file means all defaults. The file only needs the keys a user wants to change::

    default_model = "qwen2.5-1.5b"

    [engine]
    n_ctx = 8192
    gpu_layers = "auto"     # "all" or a number of layers; 0 keeps everything on the CPU

The frozen dataclasses below are the schema, one per section: a field is a key the section
accepts, its annotation the type a value must have (a ``Literal`` lists the words allowed) and
its default the value used when the file is silent (``tuple[str, ...]`` is a TOML array of
strings, ``dict[str, tuple[str, ...]]`` a table of them). ``[tools]`` is
:class:`~localchat.settings.tools.ToolsSettings`. ``[remote]`` (with ``[remote.router]`` and
``[remote.confidence]``) is :class:`~localchat.settings.remote.RemoteSettings`, which the remote
package takes as it is; the engine and the session take their own runtime objects, built from
these sections by ``engine.factory`` and ``session.factory``.

This package is the bottom layer: it imports nothing from the rest of localchat but ``paths``,
``errors`` and (to save a choice in config.toml) ``atomic``. The words a setting allows
(``KvType``, ``Thinking``, ``GpuLayers``, ``OverlongPolicy``) are defined here and read by the
engine and the session, so each setting's type, default and range has one home.

:func:`load_config` reads the file once into a :class:`Settings` and is the only place values
are checked: a malformed file, a value of the wrong type or out of range, and an unknown section
or key are each a :class:`ConfigError` naming file, line and key (with the nearest valid name
when one is close), so a typo is never silently ignored. Each number's range is one
:class:`Limit` in ``_LIMITS``; a command-line flag that overrides a setting is checked against
the same one (:func:`check_flag`), so a value the flag refuses is refused in the file too.

The TOML reading and line lookup, which the model registry shares, are ``settings.toml``'s.
"""

from __future__ import annotations

import difflib
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from localchat import paths
from localchat.errors import ConfigError, UserError
from localchat.settings.remote import RemoteSettings
from localchat.settings.toml import find_line, read_toml_file, settings_file_present
from localchat.settings.tools import ToolsSettings, builtins_problem

DEFAULT_MODEL = "smollm2-135m"

KvType = Literal["f16", "q8_0", "q4_0"]  # KV cache element types
Thinking = Literal["auto", "on", "off"]  # enable_thinking for templates that take it (Qwen3 style)
THINKING_MODES: tuple[str, ...] = get_args(Thinking)
# "auto" fits layers into free VRAM, "all" offloads every layer, a number offloads that many.
GpuLayers = Literal["auto", "all"] | int
# Speculative decoding (engine/speculate.py): prompt lookup and a draft model where one is set,
# both only where they are expected to gain ("auto"); one of them alone; or none.
Speculative = Literal["auto", "ngram", "draft", "off"]
SPECULATIVE_MODES: tuple[str, ...] = get_args(Speculative)
# A message too long for even an empty context: refused with the numbers, or cut to its head and
# tail around a visible marker (context/oversized_message.py).
OverlongPolicy = Literal["refuse", "head_tail"]


@dataclass(frozen=True)
class EngineSection:
    """``[engine]``: how a model is loaded (``engine.factory`` turns it into EngineOptions)."""

    n_ctx: int = 0  # 0 = the model's registry default (models.toml n_ctx)
    gpu_layers: GpuLayers = "auto"  # "auto" fits layers into free VRAM; "all"; a count
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0  # 0 = let llama.cpp pick (physical cores)
    flash_attn: bool = False
    kv_type: KvType = "f16"  # KV cache element type
    # Sliding-window models: full-size caches for the window layers (more memory, trims by
    # shifting) or window-size ones (checkpoints roll back, trims prefill kept turns again).
    swa_full: bool = False
    checkpoints: int = 8  # rollback states kept for recurrent, hybrid and windowed memories
    chat_template: str | None = None  # a Jinja template; a registry entry's own one wins
    chat_format: str | None = None  # a named format for GGUFs without a template
    confidence_tokens: int = 32  # leading reply tokens scored for escalation
    # Draft tokens and check them in one decode. Off until "auto" is shown to pay and never to
    # lose: on this CPU a check's logits differ from a single decode's by up to ~1 logit
    # (attention over several query tokens), and bench --speculative (2 rounds) last measured
    # edits at a median 1.16-1.26x (target 1.5x; prompt lookup's ceiling by hindsight 1.74x)
    # and prose at 1.00-1.05x, no greedy reply parting after a margin above 0.5.
    speculative: Speculative = "off"
    # A small model with the same vocabulary that drafts for every model (a registry name, hf:
    # reference or path); unset: the one models.toml pairs with the model, if downloaded.
    draft_model: str | None = None


@dataclass(frozen=True)
class SamplingSection:
    """``[sampling]``: how a reply is generated (``engine.factory`` turns it into Sampling)."""

    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 1024
    seed: int = -1  # -1 = random
    thinking: Thinking = "auto"  # the thinking switch of templates that have one


@dataclass(frozen=True)
class ContextSection:
    """``[context]``: the system prompt and how the context budget trims and summarizes."""

    system_prompt: str = ""
    trim_fraction: float = 0.25
    summary_max_tokens: int = 256
    summarize: bool = True
    overlong: OverlongPolicy = "refuse"
    summarize_threshold: float = 0.75


@dataclass(frozen=True)
class SnapshotsSection:
    """``[snapshots]``: saved KV caches of sessions."""

    enabled: bool = True
    max_bytes: int = 2 * 1024**3  # disk cap; least recently used go first


# localchat serve's port: none of Ollama (11434), LM Studio (1234), llama-server and Open WebUI
# (8080), llama-cpp-python's server and vLLM (8000), Open WebUI's dev port (3000), Jan (1337),
# KoboldCpp (5001), text-generation-webui (5000, 7860), GPT4All (4891) or Jupyter (8888) uses it,
# so serve runs beside any of them.
SERVE_PORT = 8642


@dataclass(frozen=True)
class ServeSection:
    """``[serve]``: ``localchat serve``, the OpenAI and Ollama APIs (flags override each)."""

    host: str = "127.0.0.1"  # loopback only; another address warns unless a key is set
    port: int = SERVE_PORT
    cache_ram_mib: int = 2048  # saved conversation states in RAM (0: only the live context)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed (CORS)
    aliases: tuple[str, ...] = ()  # other names the model served first answers to (--alias)
    # Requests answered at once: slots of one context, decoded together (continuous batching);
    # they share its n_ctx cells. 1: one at a time, with speculative decoding if configured.
    parallel: int = 4
    max_queue: int = 64  # requests waiting beyond the running ones; more get 503 + Retry-After
    max_body_bytes: int = 8 * 1024**2  # a larger request body gets 413
    request_timeout_s: float = 10.0  # a request's head and body must arrive within this
    idle_timeout_s: float = 60.0  # an idle keep-alive connection is closed after this


@dataclass(frozen=True)
class Settings:
    """Everything ``config.toml`` can set, with the defaults filled in. Immutable."""

    default_model: str = DEFAULT_MODEL
    engine: EngineSection = field(default_factory=EngineSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)
    context: ContextSection = field(default_factory=ContextSection)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    snapshots: SnapshotsSection = field(default_factory=SnapshotsSection)
    serve: ServeSection = field(default_factory=ServeSection)
    tools: ToolsSettings = field(default_factory=ToolsSettings)


def load_config(path: Path | None = None) -> Settings:
    """Read ``config.toml`` (default: :func:`paths.config_file`) into :class:`Settings`.

    Raises :class:`ConfigError` ("FILE:LINE: key ...") for malformed TOML, an unknown name, or a
    value of the wrong type or out of range.
    """
    path = path or paths.config_file()
    if not settings_file_present(path):
        return Settings()
    data, text = read_toml_file(path)
    return parse_settings(data, path, text)


def parse_settings(data: dict[str, Any], path: Path | None = None, text: str = "") -> Settings:
    """:class:`Settings` from parsed TOML; errors name ``path`` and a line of ``text`` if given."""
    return _build(Settings, "", data, _Source(path, text))


# Tables whose sub-tables' keys may also be written flat in the table itself
# (``[remote] rule_score = 2.5`` as well as ``[remote.router] rule_score = 2.5``).
_FLAT_SUBTABLES = {"remote"}


@dataclass(frozen=True)
class Limit:
    """The numbers a setting accepts, in config.toml and in the flags that override it: finite,
    within ``low``/``high`` (None: unbounded; ``*_open``: the bound itself is excluded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""  # what a special value means ("0 is greedy")

    def __call__(self, value: Any) -> str | None:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return None if math.isfinite(value) and above and below else f"must be {self}"

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            shown = (f"in {'(' if self.low_open else '['}{_number(self.low)}, "
                     f"{_number(self.high)}{')' if self.high_open else ']'}")
        elif self.low is not None:
            shown = f"{'more than' if self.low_open else 'at least'} {_number(self.low)}"
        elif self.high is not None:
            shown = f"{'less than' if self.high_open else 'at most'} {_number(self.high)}"
        else:
            shown = "a finite number"
        return shown + (f" ({self.note})" if self.note else "")


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an http(s) server's address, or None (``[remote] base_url``,
    ``HF_ENDPOINT``)."""
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https://"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for "Port out of range" or a non-number
    except ValueError as exc:
        return f"{url!r} is not a usable URL: {str(exc).lower()}"
    return None if parts.hostname else f"{url!r} is not a usable URL: no host name"


_POSITIVE = Limit(low=0, low_open=True)
_FRACTION = Limit(low=0, high=1)

# Range checks by dotted key, applied after the type check; each returns the problem or None.
# The one set of limits: the command-line flags that override a setting check against these too
# (:func:`check_setting`).
_LIMITS: dict[str, Callable[[Any], str | None]] = {
    "default_model": lambda name: None if name else "must be a model name",
    "engine.n_ctx": Limit(low=0, note="0 is the model's default"),
    "engine.gpu_layers": Limit(low=0),  # the count; "auto" and "all" are words
    "engine.n_batch": Limit(low=1),
    "engine.n_ubatch": Limit(low=1),
    "engine.n_threads": Limit(low=0, note="0 lets llama.cpp pick"),
    "engine.checkpoints": Limit(low=0),
    "engine.confidence_tokens": Limit(low=1),
    "sampling.temperature": Limit(low=0, note="0 is greedy"),
    "sampling.top_p": _FRACTION,
    "sampling.top_k": Limit(low=0, note="0 keeps every token"),
    "sampling.min_p": _FRACTION,
    "sampling.repeat_penalty": _POSITIVE,
    "sampling.max_tokens": Limit(low=1),
    "sampling.seed": Limit(low=-1, note="-1 is random"),
    "context.trim_fraction": Limit(low=0, high=1, high_open=True),
    "context.summary_max_tokens": Limit(low=0),
    "context.summarize_threshold": Limit(low=0, high=1, low_open=True),
    "snapshots.max_bytes": Limit(low=0),
    "serve.host": lambda host: None if host.strip() else "must be a host name or address",
    "serve.port": Limit(low=0, high=65535, note="0 picks a free one"),
    "serve.cache_ram_mib": Limit(low=0, note="0 keeps only the live context"),
    "serve.max_queue": Limit(low=0),
    "serve.parallel": Limit(low=1, high=64),
    "serve.max_body_bytes": Limit(low=1024),
    "serve.request_timeout_s": _POSITIVE,
    "serve.idle_timeout_s": _POSITIVE,
    "remote.base_url": lambda url: url_problem(url) if url else None,
    "remote.timeout_s": _POSITIVE,
    "remote.max_context_tokens": Limit(low=256),
    "remote.max_tokens": Limit(low=1),
    "remote.breaker_failures": Limit(low=1),
    "remote.router.rule_score": _POSITIVE,
    "remote.confidence.min_tokens": Limit(low=1),
    "remote.confidence.max_entropy": _POSITIVE,
    "remote.confidence.min_margin": _FRACTION,
    "remote.confidence.quantile": Limit(low=0, high=1, low_open=True, high_open=True),
    "remote.confidence.low_prob": _FRACTION,
    "tools.builtins": builtins_problem,
    "tools.max_rounds": Limit(low=1),
    "tools.timeout_s": _POSITIVE,
    "tools.max_result_chars": Limit(low=0, note="0 sizes it to the model's context"),
    "tools.start_timeout_s": _POSITIVE,
}


def check_setting(dotted: str, value: Any) -> str | None:
    """Why ``value`` is out of range for the setting ``dotted`` ("sampling.max_tokens"), or None.
    A flag that overrides a setting is checked here, so flags and files share one set of limits."""
    check = _LIMITS.get(dotted)
    if check is None or (isinstance(check, Limit) and not _is_number(value)):
        return None  # no range, or a word where a setting takes a word or a number ("auto")
    return check(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_flag(flag: str, dotted: str, value: Any) -> None:
    """UserError "--max-tokens must be ≥ 1, not 0" when a flag's value is out of the setting's range."""
    problem = None if value is None else check_setting(dotted, value)
    if problem:
        raise UserError(f"{flag} {problem}, not {value}")


# Keys that are refused with their own explanation rather than as unknown.
_REFUSED = {
    "remote.api_key": "do not put the key in config.toml; set an environment variable and "
                      "name it with api_key_env",
    "serve.api_key": "do not put the key in config.toml; set LOCALCHAT_API_KEY or pass --api-key",
}


class _Source:
    """Where parsed values came from, to point an error at the file and line."""

    def __init__(self, path: Path | None, text: str) -> None:
        self.path, self.text = path, text

    def error(self, table: str, key: str, problem: str) -> ConfigError:
        if self.path is None:
            return ConfigError(problem)
        return ConfigError(f"{self.path}:{self._line(table, key)}: {problem}")

    def _line(self, table: str, key: str) -> int:
        section = table or None
        parent = table.rpartition(".")[0] or None
        return (find_line(self.text, section, key)  # key = value
                or find_line(self.text, f"{table}.{key}" if table else key)  # [table.key]
                or find_line(self.text, parent, key)  # a flat key lifted into a sub-table
                or find_line(self.text, section)
                or 1)


def _build(cls: type, table: str, values: dict[str, Any], source: _Source) -> Any:
    """An instance of dataclass ``cls`` from the TOML ``table`` (dotted; "" = top level)."""
    hints = get_type_hints(cls)
    names = _field_names(cls)
    subtables = {name: hints[name] for name in names if is_dataclass(hints[name])}
    lifted = ({key: sub for sub, kind in subtables.items() for key in _field_names(kind)}
              if table in _FLAT_SUBTABLES else {})
    for key, value in values.items():
        if key not in names and key not in lifted:
            raise _unknown(table, key, value, [*names, *lifted], source)
    built: dict[str, Any] = {}
    for name in names:
        dotted = f"{table}.{name}" if table else name
        if name in subtables:
            nested = values.get(name, {})
            if not isinstance(nested, dict):
                shown = f"{dotted} must be a table ([{dotted}])" if table else f"[{dotted}] must be a table"
                raise source.error(table, name, shown)
            flat = {key: value for key, value in values.items() if lifted.get(key) == name}
            built[name] = _build(subtables[name], dotted, {**flat, **nested}, source)
        elif name in values:
            built[name] = _checked(dotted, values[name], hints[name], table, name, source)
    return cls(**built)


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in fields(cls)]


def _unknown(table: str, key: str, value: Any, valid: list[str], source: _Source) -> ConfigError:
    dotted = f"{table}.{key}" if table else key
    if dotted in _REFUSED:
        return source.error(table, key, f"{dotted}: {_REFUSED[dotted]}")
    nearest = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.75)
    if not table:
        what = f"section [{key}]" if isinstance(value, dict) else f"setting {key!r}"
        hint = (f"[{nearest[0]}]" if isinstance(value, dict) else repr(nearest[0])) if nearest else ""
        return source.error(table, key, f"unknown {what}" + (f" (did you mean {hint}?)" if hint else ""))
    hint = f"did you mean {nearest[0]!r}?" if nearest else f"valid keys: {', '.join(valid)}"
    return source.error(table, key, f"unknown key {key!r} in [{table}] ({hint})")


def _checked(dotted: str, value: Any, kind: Any, table: str, key: str, source: _Source) -> Any:
    """``value`` if it has type ``kind`` and is in range (ints widened to float where a float is
    expected), else a ConfigError naming the key."""
    if not _accepts(kind, value):
        raise source.error(table, key, f"{dotted} must be {_describe(kind)}, not {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and not _accepts_int(kind):
        value = float(value)
    value = _frozen(value)
    problem = check_setting(dotted, value)
    if problem:
        shown = f", not {value!r}" if problem.startswith("must") else ""
        raise source.error(table, key, f"{dotted} {problem}{shown}")
    return value


def _alternatives(kind: Any) -> tuple[Any, ...]:
    if get_origin(kind) in (Union, types.UnionType):
        # TOML has no null: an optional key is simply absent.
        return tuple(k for k in get_args(kind) if k is not type(None))
    return (kind,)


def _frozen(value: Any) -> Any:
    """TOML arrays as tuples (settings are immutable), inside tables too."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return {key: _frozen(item) for key, item in value.items()}
    return value


def _accepts(kind: Any, value: Any) -> bool:
    for alternative in _alternatives(kind):
        origin = get_origin(alternative)
        if origin is tuple:  # tuple[str, ...]: an array of strings
            if isinstance(value, list) and all(isinstance(item, str) for item in value):
                return True
        elif origin is dict:  # dict[str, tuple[str, ...]]: a table of such arrays
            if isinstance(value, dict) and all(_accepts(get_args(alternative)[1], item)
                                               for item in value.values()):
                return True
        elif origin is Literal:
            if isinstance(value, str) and value in get_args(alternative):
                return True
        elif alternative is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif alternative is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif isinstance(value, alternative):
            return True
    return False


def _accepts_int(kind: Any) -> bool:
    return int in _alternatives(kind)


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _describe(kind: Any) -> str:
    words: list[str] = []
    for alternative in _alternatives(kind):
        if get_origin(alternative) is tuple:
            words.append("a list of strings")
        elif get_origin(alternative) is dict:
            words.append("a table of lists of strings")
        elif get_origin(alternative) is Literal:
            words.extend(f'"{choice}"' for choice in get_args(alternative))
        else:
            words.append(_TYPE_NAMES.get(alternative, getattr(alternative, "__name__", "?")))
    return " or ".join(words)
