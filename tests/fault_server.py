"""A scripted OpenAI-compatible endpoint on 127.0.0.1 for the remote client's failure tests.

Each request to ``POST /v1/chat/completions`` takes the next reply from the script (the last one
repeats when the script runs out). Replies:

- ``Status(code, error="...", headers={...})``: a plain JSON error answer (500, 401, 429 with a
  ``Retry-After``, ...).
- ``Body(data, content_type, code)``: a whole answer that is no stream (a web page, a whole JSON
  reply), 200 unless told.
- ``Stream(steps)``: a 200 ``text/event-stream`` sent with chunked encoding. A step is a payload
  string (sent as ``data: <payload>\\n\\n``), a ``RawBytes`` (sent as is), ``Stall()`` (send nothing
  until the client goes away or the server closes), ``Drop()`` (cut the TCP connection without
  finishing the body), ``Trickle()`` (a line that never ends, a byte at a time), ``HugeLine()``
  (one line of many megabytes) or ``Endless(payload)`` (the same event again and again, a server
  that ignores ``max_tokens``). The last three stop at a bound of their own, or when the client
  goes away: ``bytes_sent`` (``events_sent`` for ``Endless``) tells how much it took.

It counts TCP connections, records each request (path, headers, JSON body) and notices when a
client closes its connection during a stall, so tests can assert what happened on the wire.
"""

from __future__ import annotations

import json
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler


@dataclass(frozen=True)
class Status:
    """Answer ``code`` with a JSON error; ``headers`` may be a function, called as the answer
    is sent (a Retry-After date a fixed time after the request, however late it comes)."""

    code: int
    error: str = "scripted failure"
    headers: dict[str, str] | Callable[[], dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Trickle:
    """Send ``data: xxx…`` one byte every ``interval_s`` and never a newline, for ``limit_s``."""

    interval_s: float = 0.05
    limit_s: float = 30.0


@dataclass(frozen=True)
class HugeLine:
    """Send ``data: `` then ``size`` bytes of ``x`` in 64 KB writes, with no newline."""

    size: int = 300 * 1024 * 1024


@dataclass(frozen=True)
class Body:
    """Answer ``code`` with ``data`` as the whole body, of type ``content_type``."""

    data: bytes
    content_type: str = "text/html; charset=utf-8"
    code: int = 200


@dataclass(frozen=True)
class Endless:
    """Send ``data: <payload>`` every ``interval_s`` until the client leaves, or ``limit`` times."""

    payload: str
    interval_s: float = 0.0
    limit: int = 1_000_000


@dataclass(frozen=True)
class RawBytes:
    data: bytes


@dataclass(frozen=True)
class Stall:
    """Send nothing more until the client disconnects (or the server shuts down)."""


@dataclass(frozen=True)
class KeepAlives:
    """Send ``: keep-alive`` comment lines every ``interval_s`` until the client disconnects."""

    interval_s: float = 0.05


@dataclass(frozen=True)
class Drop:
    """Cut the connection mid-body."""


@dataclass
class Stream:
    steps: list = field(default_factory=list)


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict


def chunk(content: str = "", *, finish_reason: str | None = None, model: str = "fault-model") -> str:
    """One chat.completion.chunk payload carrying ``content``."""
    delta = {"content": content} if content else {}
    return json.dumps({"object": "chat.completion.chunk", "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> str:
    return json.dumps({"object": "chat.completion.chunk", "model": "fault-model", "choices": [],
                       "usage": {"prompt_tokens": prompt_tokens,
                                 "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens}})


def reply(*pieces: str, usage: tuple[int, int] | None = None) -> Stream:
    """A well-formed stream: a role delta, one chunk per piece, a stop chunk, usage, [DONE]."""
    steps = [json.dumps({"object": "chat.completion.chunk", "model": "fault-model",
                         "choices": [{"index": 0, "delta": {"role": "assistant"},
                                      "finish_reason": None}]})]
    steps += [chunk(p) for p in pieces]
    steps.append(chunk(finish_reason="stop"))
    if usage:
        steps.append(usage_chunk(*usage))
    steps.append("[DONE]")
    return Stream(steps)


class FaultServer:
    """Start with ``with FaultServer([...]) as server:``; ``server.base_url`` ends in ``/v1``."""

    def __init__(self, script: list | None = None) -> None:
        self.script = list(script or [reply("ok")])
        self.requests: list[RecordedRequest] = []
        self.request_times: list[float] = []  # time.monotonic() as each request arrived
        self.bytes_sent = 0  # by Trickle and HugeLine steps
        self.events_sent = 0  # by Endless steps
        self.connections = 0
        self._lock = threading.Lock()
        self._shutdown = threading.Event()
        self.client_closed_during_stall = threading.Event()
        self.stall_started = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fault = self
        # A short poll interval: shutdown() waits for it, once per test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fault-server", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def next_reply(self) -> Status | Body | Stream:
        with self._lock:
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._shutdown.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _count_connection(self) -> None:
        with self._lock:
            self.connections += 1


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    fault: FaultServer

    def process_request(self, request, client_address):  # one call per accepted connection
        self.fault._count_connection()
        super().process_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        self._send_json(200, {"object": "list", "data": [{"id": "fault-model", "object": "model"}]})

    def do_POST(self) -> None:
        fault = self.server.fault
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"unparsed": raw.decode("utf-8", "replace")}
        fault.requests.append(RecordedRequest(self.path, dict(self.headers.items()), body))
        fault.request_times.append(time.monotonic())
        answer = fault.next_reply()
        if isinstance(answer, Status):
            headers = answer.headers() if callable(answer.headers) else answer.headers
            self._send_json(answer.code, {"error": {"message": answer.error, "type": "server_error"}},
                            headers)
            return
        if isinstance(answer, Body):
            self._send_body(answer.code, answer.data, answer.content_type)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        for step in answer.steps:
            if isinstance(step, Stall):
                self._stall()
                return
            if isinstance(step, KeepAlives):
                self._keep_alive(step.interval_s)
                return
            if isinstance(step, Trickle):
                self._trickle(step)
                return
            if isinstance(step, HugeLine):
                self._huge_line(step.size)
                return
            if isinstance(step, Endless):
                self._endless(step)
                return
            if isinstance(step, Drop):
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            data = step.data if isinstance(step, RawBytes) else f"data: {step}\n\n".encode()
            if not self._write_chunk(data):
                return
        self._write_chunk(b"")
        self.close_connection = True

    def _write_chunk(self, data: bytes) -> bool:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            return True
        except OSError:
            return False  # the client went away

    def _keep_alive(self, interval_s: float) -> None:
        fault = self.server.fault
        self.close_connection = True
        while not fault._shutdown.wait(interval_s):
            if not self._write_chunk(b": keep-alive\n\n"):
                return

    def _trickle(self, step: Trickle) -> None:
        fault = self.server.fault
        self.close_connection = True
        if not self._write_chunk(b"data: "):
            return
        deadline = time.monotonic() + step.limit_s
        while time.monotonic() < deadline and not fault._shutdown.wait(step.interval_s):
            if not self._write_chunk(b"x"):
                return
            fault.bytes_sent += 1

    def _huge_line(self, size: int) -> None:
        fault = self.server.fault
        self.close_connection = True
        if not self._write_chunk(b"data: "):
            return
        piece = b"x" * 65536
        while fault.bytes_sent < size and not fault._shutdown.is_set():
            if not self._write_chunk(piece):
                return
            fault.bytes_sent += len(piece)

    def _endless(self, step: Endless) -> None:
        fault = self.server.fault
        self.close_connection = True
        data = f"data: {step.payload}\n\n".encode()
        while fault.events_sent < step.limit and not fault._shutdown.is_set():
            if not self._write_chunk(data):
                return
            fault.events_sent += 1
            if step.interval_s:
                time.sleep(step.interval_s)

    def _stall(self) -> None:
        # Wait until the client closes (the socket turns readable and reads as EOF) or shutdown.
        fault = self.server.fault
        fault.stall_started.set()
        self.close_connection = True
        while not fault._shutdown.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if not readable:
                continue
            try:
                data = self.connection.recv(1024)
            except OSError:
                data = b""
            if not data:
                fault.client_closed_during_stall.set()
                return

    def _send_json(self, code: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        self._send_body(code, json.dumps(payload).encode(), "application/json", headers)

    def _send_body(self, code: int, data: bytes, content_type: str,
                   headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True
