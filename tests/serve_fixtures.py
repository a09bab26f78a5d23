"""Helpers for the ``localchat serve`` tests: a real server on 127.0.0.1 (an ephemeral port) in a
thread of the test process, over a model host that loads the real test model once per module,
and raw-socket requests for what no client library sends (a foreign Host header, half a body)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from localchat.models.registry import resolve_model
from localchat.serve.app import ServeApp, ServeOptions
from localchat.serve.http import Limits
from localchat.serve.model_host import ModelHost
from localchat.settings import Settings

MODEL = "smollm2-135m"


def loaded_host(model_path: Path, cache_mib: int = 64, n_ctx: int = 1024,
                name: str = MODEL) -> ModelHost:
    """A host serving ``model_path`` under ``name`` (the test model's registry name), loaded."""
    spec = replace(resolve_model(str(model_path)), name=name)
    host = ModelHost(Settings(), spec, n_ctx=n_ctx, cache_bytes=cache_mib * 1024**2)
    host.acquire(host.default())
    return host


@contextmanager
def running(host: ModelHost, **overrides) -> Iterator[ServeApp]:
    """A ServeApp on 127.0.0.1 (any free port) in a thread; stopped afterwards (the host stays
    loaded for the next one)."""
    limits = overrides.pop("limits", Limits(max_body_bytes=64 * 1024, request_timeout_s=2.0,
                                            idle_timeout_s=5.0))
    options = replace(ServeOptions("127.0.0.1", 0, None, [], 64, limits), **overrides)
    with ServeApp(host, options).in_thread() as app:
        yield app


@contextmanager
def serving(model_path: Path, name: str, n_ctx: int = 1024) -> Iterator[ServeApp]:
    """``model_path`` loaded and served under ``name`` (``running``); unloaded afterwards."""
    host = loaded_host(model_path, n_ctx=n_ctx, name=name)
    try:
        with running(host) as app:
            yield app
    finally:
        host.unload()


def openai_client(app: ServeApp):
    """The ``openai`` SDK's client of ``app`` (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=app.base_url + "/v1", api_key="any", max_retries=0)


def raw(app: ServeApp, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as it is on a new connection; (status, headers, body) of the answer, read
    until the server closes or the Content-Length is complete."""
    with socket.create_connection(("127.0.0.1", app.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {buffer!r}")
        buffer += chunk
    head, body = buffer.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def post(path: str, body: dict | bytes, host: str = "127.0.0.1", **headers: str) -> bytes:
    """A POST request's bytes (JSON body), with extra headers."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {len(data)}", "Connection: close"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def get(path: str, host: str = "127.0.0.1", **headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
