"""User configuration: ``config.toml`` in the config dir (``LOCALCHAT_HOME/config.toml``).

A missing file means all defaults. The file only needs the keys a user wants to change::

    default_model = "qwen2.5-1.5b"

    [engine]
    n_ctx = 8192
    gpu_layers = "auto"     # or an int; 0 keeps everything on the CPU

Each section is a plain dict holding the effective values (defaults overlaid by the file).
A feature reads its own keys with ``config.engine.get("key", default)``; the keys a section
accepts are its defaults below plus the fields of the settings object built from it
(:func:`known_keys`). A name close to one of those is a misspelling, reported with the nearest
valid name; names close to none are kept, so sections stay open to new features.
Values of the keys known below are type-checked; a wrong type, an unknown name or malformed TOML
is a :class:`ConfigError` naming file, line and key.

This module also holds the small TOML helpers the model registry shares (line lookup, writing).
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat import paths
from localchat.atomic import write_text_atomic
from localchat.errors import ConfigError

DEFAULT_MODEL = "smollm2-135m"

# Section defaults. The types here are also the types a file must use for these keys.
SECTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "engine": {
        "n_ctx": 0,  # 0 = the model's registry default (models.toml n_ctx)
        "gpu_layers": "auto",  # "auto" fits layers into free VRAM; an int forces a count
        "n_batch": 512,
        "n_ubatch": 512,
        "n_threads": 0,  # 0 = let llama.cpp pick (physical cores)
        "flash_attn": False,
        "kv_type": "f16",  # KV cache element type: f16, q8_0, q4_0
        # Sliding-window models: full-size caches for the window layers (more memory, trims by
        # shifting) or window-size ones (checkpoints roll back, trims prefill kept turns again).
        "swa_full": False,
        "checkpoints": 8,  # rollback states kept for recurrent, hybrid and windowed memories
    },
    "sampling": {
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": 0.05,
        "repeat_penalty": 1.1,
        "max_tokens": 1024,
        "seed": -1,  # -1 = random
        "thinking": "auto",  # auto | on | off: the thinking switch of templates that have one
    },
    "remote": {
        "mode": "off",  # off | ask | auto: nothing is ever sent anywhere while it is off
        "base_url": "",
        "model": "",
        "timeout_s": 30.0,
        # The key itself never lives in the config file, only the name of the variable holding it.
        "api_key_env": "LOCALCHAT_REMOTE_API_KEY",
    },
    "snapshots": {
        "enabled": True,
        "max_bytes": 2 * 1024**3,  # disk cap for saved KV caches; least recently used go first
    },
    "context": {
        "system_prompt": "",
        "trim_fraction": 0.25,
        "summary_max_tokens": 256,
        "summarize": True,
        "overlong": "refuse",  # or "head_tail"
        "summarize_threshold": 0.75,
    },
}

# Keys whose value must be one of a few words.
_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("sampling", "thinking"): ("auto", "on", "off"),
}

# Keys whose value may be one of several types ("auto" or a layer count).
_ALTERNATIVE_TYPES: dict[tuple[str, str], tuple[type, ...]] = {
    ("engine", "gpu_layers"): (str, int),
}


@dataclass
class Config:
    """Effective configuration. ``raw`` is the file's content exactly as parsed (empty if none)."""

    default_model: str = DEFAULT_MODEL
    engine: dict[str, Any] = field(default_factory=lambda: dict(SECTION_DEFAULTS["engine"]))
    sampling: dict[str, Any] = field(default_factory=lambda: dict(SECTION_DEFAULTS["sampling"]))
    context: dict[str, Any] = field(default_factory=lambda: dict(SECTION_DEFAULTS["context"]))
    remote: dict[str, Any] = field(default_factory=lambda: dict(SECTION_DEFAULTS["remote"]))
    snapshots: dict[str, Any] = field(default_factory=lambda: dict(SECTION_DEFAULTS["snapshots"]))
    raw: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def section(self, name: str) -> dict[str, Any]:
        """A section by name; unknown sections come from ``raw`` (empty dict if absent)."""
        if name in SECTION_DEFAULTS:
            return getattr(self, name)
        value = self.raw.get(name, {})
        return value if isinstance(value, dict) else {}


def load_config(path: Path | None = None) -> Config:
    """Read ``config.toml`` (default: :func:`paths.config_file`) and overlay it on the defaults.

    Raises :class:`ConfigError` for malformed TOML or a known key with a value of the wrong type.
    """
    path = path or paths.config_file()
    if not path.exists():
        return Config(path=path)
    raw, text = read_toml_file(path)
    config = Config(raw=raw, path=path)

    if "default_model" in raw:
        value = raw["default_model"]
        if not isinstance(value, str) or not value:
            raise _type_error(path, text, None, "default_model", "a model name", value)
        config.default_model = value

    _check_names(path, text, raw)
    for section, defaults in SECTION_DEFAULTS.items():
        if section not in raw:
            continue
        values = raw[section]
        if not isinstance(values, dict):
            raise ConfigError(f"{path}:{line_of(text, None, section)}: [{section}] must be a table")
        for key, value in values.items():
            if key in defaults:
                _check_type(path, text, section, key, value, defaults[key])
        getattr(config, section).update(values)
    _check_remote(path, text, config.remote)
    return config


def known_keys() -> dict[str, set[str]]:
    """Every key each section accepts: its defaults plus the settings objects built from it."""
    from dataclasses import fields

    from localchat.engine.options import EngineOptions, Sampling
    from localchat.remote.settings import ConfidenceThresholds, RemoteSettings, RouterThresholds

    def names(*classes: type) -> set[str]:
        return {f.name for cls in classes for f in fields(cls)}

    keys = {section: set(defaults) for section, defaults in SECTION_DEFAULTS.items()}
    keys["engine"] |= names(EngineOptions)
    keys["sampling"] |= names(Sampling)
    # api_key is known so that RemoteSettings can say why it must not be there.
    keys["remote"] |= names(RemoteSettings, RouterThresholds, ConfidenceThresholds) | {"api_key"}
    keys["remote.router"] = names(RouterThresholds)
    keys["remote.confidence"] = names(ConfidenceThresholds)
    return keys


def _check_names(path: Path, text: str, raw: dict[str, Any]) -> None:
    """A misspelled section or key would be silently ignored: one that is close to a valid name
    is an error naming it. Names close to none stay allowed (sections are open to features)."""
    known = known_keys()
    top_level = ["default_model", *SECTION_DEFAULTS]
    for top, value in raw.items():
        nearest = _nearest(top, top_level)
        if top in top_level or not nearest:
            continue
        if isinstance(value, dict):
            raise ConfigError(f"{path}:{line_of(text, top)}: unknown section [{top}] "
                              f"(did you mean [{nearest}]?)")
        raise ConfigError(f"{path}:{line_of(text, None, top)}: unknown setting {top!r} "
                          f"(did you mean {nearest!r}?)")
    for section in SECTION_DEFAULTS:
        values = raw.get(section)
        if not isinstance(values, dict):
            continue
        tables = [(section, values)] + [(f"{section}.{k}", v) for k, v in values.items()
                                        if isinstance(v, dict) and f"{section}.{k}" in known]
        for table, entries in tables:
            for key in entries:
                nearest = _nearest(key, known[table])
                if key in known[table] or f"{table}.{key}" in known or not nearest:
                    continue
                raise ConfigError(f"{path}:{line_of(text, table, key)}: unknown key {key!r} in "
                                  f"[{table}] (did you mean {nearest!r}?)")


def _nearest(name: str, candidates: Any) -> str | None:
    import difflib

    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.75)
    return match[0] if match else None


def _check_remote(path: Path, text: str, section: dict[str, Any]) -> None:
    """[remote] is validated now, with the file and line, so a bad base_url or mode cannot
    surface later as a traceback in the middle of a chat."""
    from localchat.remote.settings import RemoteSettings

    try:
        RemoteSettings.from_config(section)
    except ConfigError as exc:
        message = str(exc)
        match = re.match(r"\[remote\] (?:(router|confidence)\.)?(\w+)", message)
        table = f"remote.{match.group(1)}" if match and match.group(1) else "remote"
        line = line_of(text, table, match.group(2) if match else None)
        raise ConfigError(f"{path}:{line}: {message}") from None


def save_config(config: Config, path: Path | None = None) -> Path:
    """Write ``config`` atomically; only values that differ from the defaults are written, plus
    every key the file already had (so unknown keys and comments-free user choices survive).
    Returns the path written."""
    path = path or config.path or paths.config_file()
    data: dict[str, Any] = copy.deepcopy(config.raw)
    if config.default_model != DEFAULT_MODEL or "default_model" in data:
        data["default_model"] = config.default_model
    for section, defaults in SECTION_DEFAULTS.items():
        current = getattr(config, section)
        written = data.setdefault(section, {})
        for key, value in current.items():
            if key in written or defaults.get(key, _MISSING) != value:
                written[key] = value
        if not written:
            del data[section]
    write_text_atomic(path, dump_toml(data))
    config.raw, config.path = data, path
    return path


# --- TOML helpers shared with the model registry ---------------------------------------------

_MISSING = object()
_LINE_IN_MESSAGE = re.compile(r"\(at line (\d+), column \d+\)")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def read_toml_file(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a TOML file; returns (data, text). Malformed TOML -> ConfigError "FILE:LINE: ..."."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _LINE_IN_MESSAGE.search(message)
        where = f"{path}:{match.group(1)}" if match else str(path)
        reason = _LINE_IN_MESSAGE.sub("", message).strip()
        raise ConfigError(f"{where}: invalid TOML: {reason}") from None


def line_of(text: str, table: str | None, key: str | None = None) -> int:
    """Best-effort line number (1-based) of ``key`` inside ``[table]`` (None = top level), or of
    the table's header when ``key`` is None.

    tomllib reports no positions for valid documents, so this scans headers and ``key =`` lines.
    Falls back to the table header's line, then to 1. ``table`` is a dotted path of plain names
    (quoted header parts such as ``[models."qwen2.5-7b"]`` are matched after unquoting).
    """
    current: str | None = None
    header_line = 1
    for number, line in enumerate(text.splitlines(), start=1):
        header = table_header(line)
        if header is not None:
            current = header
            if current == table:
                header_line = number
            continue
        stripped = line.strip()
        if key is not None and current == table and "=" in stripped:
            name = _unquote(stripped.split("=", 1)[0].strip())
            if name == key:
                return number
    return header_line


def table_header(line: str) -> str | None:
    """The dotted name of a ``[table]`` header line with quotes removed, else None."""
    stripped = line.strip()
    if not stripped.startswith("[") or stripped.startswith("[["):
        return None
    parts = re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', _header_inner(stripped).strip())
    return ".".join(_unquote(part.strip()) for part in parts)


def _header_inner(stripped: str) -> str:
    # A quoted part may itself contain "]" or "#", so find the closing bracket outside quotes.
    quote = None
    for index, char in enumerate(stripped[1:], start=1):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "]":
            return stripped[1:index]
    return stripped[1:]


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name


def dump_toml(data: dict[str, Any]) -> str:
    """Serialize nested dicts of scalars and scalar lists as TOML (tables for nested dicts)."""
    lines: list[str] = []
    _dump_table(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _dump_table(table: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    subtables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if prefix and (scalars or not subtables):
        lines.append("")
        lines.append("[" + ".".join(_toml_key(p) for p in prefix) + "]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in subtables.items():
        _dump_table(value, [*prefix, key], lines)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes (\" \\ \n \t \uXXXX) are all valid in TOML basic strings.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Path):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _check_type(path: Path, text: str, section: str, key: str, value: Any, default: Any) -> None:
    allowed = _ALTERNATIVE_TYPES.get((section, key), (type(default),))
    # TOML ints are acceptable where a float is expected (temperature = 1).
    if float in allowed:
        allowed = (*allowed, int)
    ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
    if (section, key) == ("engine", "gpu_layers") and isinstance(value, str):
        ok = value == "auto"
    if not ok:
        expected = " or ".join(_TYPE_NAMES[t] for t in allowed if t in _TYPE_NAMES)
        if (section, key) == ("engine", "gpu_layers"):
            expected = '"auto" or a number of layers'
        raise _type_error(path, text, section, key, expected, value)
    choices = _CHOICES.get((section, key))
    if choices and value not in choices:
        raise _type_error(path, text, section, key, " or ".join(f'"{c}"' for c in choices), value)


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _type_error(path: Path, text: str, section: str | None, key: str, expected: str,
                value: Any) -> ConfigError:
    dotted = f"{section}.{key}" if section else key
    return ConfigError(
        f"{path}:{line_of(text, section, key)}: {dotted} must be {expected}, not {value!r}"
    )
