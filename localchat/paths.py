"""Where localchat keeps things on disk.

One function per directory; each creates its directory on first use. ``LOCALCHAT_HOME=DIR`` puts
everything under one folder (tests, portable installs): ``DIR/config.toml``, ``DIR/models.toml``,
``DIR/mcp.json``, ``DIR/data``, ``DIR/cache``. Otherwise the platform's user dirs (platformdirs)
are used.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "localchat"


def _home() -> Path | None:
    home = os.environ.get("LOCALCHAT_HOME")
    return Path(home).expanduser() if home else None


def _ensure(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only home, a file where a folder should be
        from localchat.errors import UserError

        raise UserError(f"cannot create the folder {path}: {exc.strerror or exc} "
                        "(set LOCALCHAT_HOME to a writable folder)") from None
    return path


def config_dir() -> Path:
    home = _home()
    return _ensure(home if home else Path(platformdirs.user_config_dir(APP_NAME)))


def data_dir() -> Path:
    home = _home()
    return _ensure(home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME)))


def cache_dir() -> Path:
    home = _home()
    return _ensure(home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME)))


def config_file() -> Path:
    return config_dir() / "config.toml"


def user_registry_file() -> Path:
    return config_dir() / "models.toml"


def mcp_config_file() -> Path:
    """MCP servers, in the ``mcpServers`` format other apps use (localchat.tools reads it)."""
    return config_dir() / "mcp.json"


def models_dir() -> Path:
    return _ensure(data_dir() / "models")


def database_file() -> Path:
    return data_dir() / "sessions.db"


def snapshots_dir() -> Path:
    return _ensure(cache_dir() / "kv")


def log_file() -> Path:
    """Tracebacks of unexpected failures (logs.py caps its size)."""
    return data_dir() / "localchat.log"


def broken_link(path: Path) -> str | None:
    """What is wrong with ``path`` when it is a symbolic link that leads nowhere ("is a symbolic
    link to X, which does not exist", "... that loops back on itself"); None otherwise. Such a
    path reads as missing to ``exists()``, which would make a user's file silently not count."""
    import errno

    try:
        os.stat(path)
    except FileNotFoundError:
        return f"is a symbolic link to {os.readlink(path)}, which does not exist" \
            if path.is_symlink() else None
    except OSError as exc:
        return "is a symbolic link that loops back on itself" if exc.errno == errno.ELOOP else None
    return None
