"""The environment a tool's child process gets: an allow-list, never localchat's secrets.

A tool server is a program the user chose, but it need not see everything localchat's process
sees: the remote's API key above all. :func:`child_environment` passes only the variables a
program needs to run where the user is (``PATH``, ``HOME``, the locale, the temp folder, TLS
certificate locations...) plus what the server's own entry sets, and drops localchat's secrets
(``settings.tools.secret_env_names``) even if one were on the list. Proxies are not passed on
(their URLs may carry credentials): an entry that needs one says so, e.g.
``"env": {"HTTPS_PROXY": "${env:HTTPS_PROXY}"}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

INHERITED = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM",
    "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME",
    "TMPDIR", "TEMP", "TMP", "TZ",
    "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE",
    # Windows: what programs need to start at all.
    "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "PATHEXT", "APPDATA", "LOCALAPPDATA",
    "PROGRAMDATA", "PROGRAMFILES", "USERPROFILE", "HOMEDRIVE", "HOMEPATH", "USERNAME",
)
# The MCP SDK adds these from our own environment beneath whatever we pass.
_SDK_DEFAULTS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


def child_environment(own: Mapping[str, str] | None = None,
                      secrets: frozenset[str] = frozenset()) -> dict[str, str]:
    """The environment for a tool's child: the allow-list from ours, then ``own`` (the entry's
    ``env``) over it; no variable named in ``secrets`` is taken from ours."""
    env = {}
    for name in INHERITED:
        value = os.environ.get(name)
        if value is None or name in secrets or value.startswith("()"):  # a shell function
            continue
        env[name] = value
    env.update(own or {})
    for name in secrets:
        if name in _SDK_DEFAULTS and name not in (own or {}):
            env[name] = ""  # would otherwise be filled in from ours by the SDK
    return env
