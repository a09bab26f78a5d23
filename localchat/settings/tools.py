"""The ``[tools]`` section of config.toml: :class:`ToolsSettings` is its schema and defaults.

Example::

    [tools]
    builtins = ["read_file", "list_directory"]   # off until listed; run_command runs anything
    max_rounds = 8            # tool rounds in one reply before the model must answer
    timeout_s = 60            # one call's limit
    max_result_chars = 0      # a result's size cap; 0 sizes it to the model's context
    start_timeout_s = 30      # an MCP server that has not answered by then is failed

    [tools.always_allow]      # calls that run without asking, per server (builtin: localchat's)
    filesystem = ["read_file", "list_directory"]
    builtin = ["read_file"]

MCP servers themselves are configured in ``mcp.json`` beside this file (``localchat.tools``
reads it), the format other apps use. :func:`save_always_allow` adds one tool to
``[tools.always_allow]`` the way a user would, keeping the file's comments and layout (tomlkit).
:func:`secret_env_names` names the environment variables that hold localchat's own secrets,
which no tool's child process may receive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localchat import paths
from localchat.errors import ConfigError
from localchat.settings.remote import RemoteSettings

BUILTIN_TOOLS = ("read_file", "list_directory", "run_command")
BUILTIN_SERVER = "builtin"  # the name localchat's own tools go by, in config and on screen
SERVE_KEY_ENV = "LOCALCHAT_API_KEY"  # the key clients of `localchat serve` must send
ANY_TOOL = "*"

DEFAULT_RESULT_CHARS = 16_000  # when the context is not known (`localchat tools`)
MIN_RESULT_CHARS = 1_000


@dataclass(frozen=True)
class ToolsSettings:
    """Everything the tool registry, the approval policy and the tool rounds need. Immutable."""

    builtins: tuple[str, ...] = ()  # localchat's own tools turned on, from BUILTIN_TOOLS
    max_rounds: int = 8
    timeout_s: float = 60.0
    max_result_chars: int = 0  # 0: a quarter of the model's context (result_chars)
    start_timeout_s: float = 30.0
    # Server name -> tool names (or "*") that run without asking.
    always_allow: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def result_chars(self, n_ctx: int | None = None) -> int:
        """The most characters of one result the model is given: the setting, or a quarter of
        a context of ``n_ctx`` tokens at about four characters a token."""
        if self.max_result_chars:
            return self.max_result_chars
        if not n_ctx:
            return DEFAULT_RESULT_CHARS
        return max(MIN_RESULT_CHARS, n_ctx)

    def always_allowed(self, server: str, tool: str) -> bool:
        names = self.always_allow.get(server, ())
        return tool in names or ANY_TOOL in names


def builtins_problem(names: tuple[str, ...]) -> str | None:
    """Why ``[tools] builtins`` is wrong, or None."""
    unknown = [name for name in names if name not in BUILTIN_TOOLS]
    if unknown:
        return (f"names no built-in tool {unknown[0]!r} (the built-ins are "
                f"{', '.join(BUILTIN_TOOLS)})")
    return None


def secret_env_names(remote: RemoteSettings) -> frozenset[str]:
    """The environment variables whose values are localchat's secrets: the remote's API key
    (the variable ``[remote] api_key_env`` names, and the default one) and serve's key."""
    names = {SERVE_KEY_ENV, RemoteSettings().api_key_env}
    if remote.api_key_env:
        names.add(remote.api_key_env)
    return frozenset(names)


def save_always_allow(server: str, tool: str, path: Path | None = None) -> Path:
    """Add ``tool`` to ``server``'s list in ``[tools.always_allow]`` of config.toml (created if
    missing), keeping the rest of the file as it was. Returns the file written."""
    import tomlkit  # only here: saving a choice is rare, start-up should not pay for it

    from localchat.atomic import write_text_atomic

    path = path or paths.config_file()
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        document = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise ConfigError(f"{path}:{exc.line}: invalid TOML: cannot save the choice") from None
    tools = document.get("tools")
    if tools is None:
        tools = document["tools"] = tomlkit.table(is_super_table=True)
    allow = tools.get("always_allow")
    if allow is None:
        allow = tools["always_allow"] = tomlkit.table()
    names = allow.get(server)
    if names is None:
        allow[server] = [tool]
    elif tool not in names:
        names.append(tool)
    write_text_atomic(path, tomlkit.dumps(document))
    return path
