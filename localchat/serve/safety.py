"""What a request must show before ``localchat serve`` reads it: the conventions the trusted local
servers reached after their CVEs.

- **Host** (DNS rebinding, Ollama CVE-2024-28224): a page on ``evil.example`` whose name is made
  to resolve to 127.0.0.1 reaches a loopback server with ``Host: evil.example``. While serve is
  bound to a loopback address the Host header must name ``localhost`` (or a ``*.localhost``
  name) or a loopback address, any port; otherwise 403. Bound to another address (the user chose
  to be reachable), any IP address, this machine's name and the address given also pass, and
  with a key any name does (a rebinding page cannot know the key; a client in a container calls
  the host by names such as ``host.docker.internal``).
- **Origin**: a browser page may only call serve when ``--cors-origin`` names its origin; then
  (and only then) the answers carry CORS headers for it, and its preflight ``OPTIONS`` is
  answered, allowing the headers it asks for (``Access-Control-Request-Headers``). A request
  whose Origin is not named gets 403 before anything runs.
- **Key**: with ``--api-key`` (or ``LOCALCHAT_API_KEY``) every route but ``/health`` and ``/``
  needs ``Authorization: Bearer KEY``, compared in constant time (``hmac.compare_digest``), else
  401. Without a key any bearer is accepted (Open WebUI always sends one). A key a client could
  not send as it is (``key_problem``: not printable ASCII, or whitespace at either end, which a
  header loses) is refused when serve starts.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket

from localchat.serve.http import Request
from localchat.serve.http_errors import Refused

# A header's name (RFC 9110's token): what a preflight's list may echo back, nothing else.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")

# Routes a load balancer or a client's "is it up?" probe calls without a key.
PUBLIC_PATHS = frozenset({"/", "/health", "/v1/health"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, no port) is this machine's loopback."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a Host header: ``[::1]:8642`` -> ``[::1]``, ``localhost:80`` -> ``localhost``."""
    if header.startswith("["):
        return header[:header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def key_problem(key: str) -> str | None:
    """Why no client could send ``key`` in ``Authorization: Bearer KEY`` (None: one can).
    Headers travel as Latin-1 at best (http reads them so), and the space around a header's
    value is not part of it: a key outside printable ASCII, or with a space at either end,
    would never match, and every request would get 401."""
    if key != key.strip():
        return "must not begin or end with whitespace (a header's value loses it)"
    if not all(" " <= char <= "~" for char in key):
        return ("must be printable ASCII (letters, digits and punctuation): a client sends it "
                "in a header")
    return None


class Gate:
    """The checks above for one server's settings."""

    def __init__(self, bind_host: str, api_key: str | None, cors_origins: list[str]) -> None:
        self.bind_host = bind_host
        self._key = api_key.encode("utf-8") if api_key else None
        self.cors_origins = [origin.rstrip("/") for origin in cors_origins]
        self._loopback_only = is_loopback(bind_host)
        self._own_names = {bind_host.lower(), socket.gethostname().lower()}

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def refuse(self, request: Request) -> Refused | None:
        """Why ``request`` must not be served (403 or 401), or None."""
        host = host_of(request.headers.get("host", "")).lower()
        if request.headers.get("host") is not None and not self._host_allowed(host):
            return Refused(403, f"the Host header {host!r} is not this server's (requests must "
                               "name localhost or a loopback address)", "forbidden_host")
        origin = request.headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return Refused(403, f"requests from the web origin {origin!r} are not allowed; start "
                               f"serve with --cors-origin {origin} to allow them",
                           "forbidden_origin")
        needs_key = (self._key is not None and request.path not in PUBLIC_PATHS
                     and request.method != "OPTIONS")
        if needs_key and not self._key_matches(request.headers.get("authorization", "")):
            return Refused(401, "a valid API key is required: send Authorization: Bearer KEY",
                           "invalid_api_key", {"WWW-Authenticate": "Bearer"})
        return None

    def _host_allowed(self, host: str) -> bool:
        if is_loopback(host):
            return True
        if self._loopback_only:
            return False
        return self._key is not None or _is_ip(host) or host in self._own_names

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.rstrip("/")
        return "*" in self.cors_origins or origin in self.cors_origins

    def _key_matches(self, authorization: str) -> bool:
        scheme, _, token = authorization.partition(" ")
        given = token.strip().encode("utf-8") if scheme.lower() == "bearer" else b""
        assert self._key is not None
        return hmac.compare_digest(given, self._key)

    def cors_headers(self, request: Request) -> dict[str, str]:
        """The CORS headers for ``request``'s origin when it is allowed (none otherwise)."""
        origin = request.headers.get("origin")
        if origin is None or not self.cors_origins or not self.origin_allowed(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def preflight_headers(self, request: Request) -> dict[str, str]:
        """The answer to a preflight: for an allowed origin, the headers it asks to send
        (``Access-Control-Request-Headers``: the OpenAI JS SDK sends ``x-stainless-*`` ones,
        which a fixed list would refuse) besides ``Authorization`` and ``Content-Type``."""
        cors = self.cors_headers(request)
        allowed = ["Authorization", "Content-Type"]
        if cors:
            asked = request.headers.get("access-control-request-headers", "")
            allowed += [name for name in (part.strip() for part in asked.split(","))
                        if _HEADER_NAME.fullmatch(name) and name.lower() not in
                        ("authorization", "content-type")]
            cors["Vary"] = "Origin, Access-Control-Request-Headers"
        return {**cors, "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": ", ".join(dict.fromkeys(allowed)),
                "Access-Control-Max-Age": "600"}


def exposure_warning(bind_host: str, has_key: bool) -> str | None:
    """What to tell the user who binds serve beyond loopback without a key (None otherwise)."""
    if is_loopback(bind_host) or has_key:
        return None
    return (f"serve is listening on {bind_host}, beyond this machine, with no API key: anyone who "
            "can reach this address can use the model; set --api-key or LOCALCHAT_API_KEY")
