"""HTTP/1.1 over asyncio streams: the part of a web server that ``localchat serve`` needs, and
nothing it does not (no TLS, no upgrades, no multipart).

Why the standard library and not starlette/uvicorn: the limits a local server must hold against
a hostile page or a stuck client are the protocol's own, and here each is one line in one place:
a request's head and body must arrive within ``request_timeout_s`` of its first byte (slowloris),
an idle keep-alive connection is closed after ``idle_timeout_s``, a body over ``max_body_bytes``
is refused (413) before it is read, a head over 64 KiB gets 431, and a client that goes away is
seen at once (``Connection.gone``) while its request waits or streams, without reading a byte
of a request it may have pipelined behind. uvicorn has no deadline for a request's head or body,
and a body cap and disconnect watching would be middleware around it; none of it adds a
dependency or a hop per streamed token here.

A handler gets a :class:`Request` and answers through its :class:`Connection`: ``send`` a whole
response, or ``start_stream`` and ``write`` chunks (``Transfer-Encoding: chunked``, so the
connection stays usable afterwards). Header names are lower-case.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

from localchat.serve.http_errors import Unreadable

MAX_HEAD_BYTES = 64 * 1024
_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * 1024**2
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0


@dataclass
class Request:
    method: str
    target: str  # as sent: path and query
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: dict[str, str]
    body: bytes = b""
    received_at: float = field(default_factory=time.perf_counter)  # when its head was complete

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


class Connection:
    """One client connection: reads requests (with the limits), writes responses, and watches
    for the client going away while a request is being answered."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 limits: Limits) -> None:
        self._reader = reader
        self._writer = writer
        self._limits = limits
        self._buffer = bytearray()
        self._eof = False
        self.gone = asyncio.Event()  # the client closed its end (or the socket failed)
        self._on_gone: list[Callable[[], None]] = []
        self._watcher: asyncio.Task | None = None
        self._chunked = False
        self.keep_alive = True
        self.busy = False  # a request is being answered
        self.responded = False  # this request's response head has been written
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    # -- reading ------------------------------------------------------------------------------

    async def next_request(self) -> Request | None:
        """The next request; None when the client closed the connection or left it idle. Raises
        Unreadable for one that is malformed, too large or too slow."""
        if not self._buffer:
            try:
                await asyncio.wait_for(self._fill(), self._limits.idle_timeout_s)
            except TimeoutError:
                return None
            if not self._buffer:
                return None
        try:
            return await asyncio.wait_for(self._read_request(), self._limits.request_timeout_s)
        except TimeoutError:
            raise Unreadable(408, "the request did not arrive in time") from None

    async def _fill(self) -> None:
        data = await self._reader.read(_READ_SIZE)
        if data:
            self._buffer += data
        else:
            self._eof = True

    async def _read_request(self) -> Request:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise Unreadable(431, "the request's headers are too large")
            if self._eof:
                raise Unreadable(400, "the connection closed in the middle of a request")
            await self._fill()
        if end > MAX_HEAD_BYTES:
            raise Unreadable(431, "the request's headers are too large")
        head = bytes(self._buffer[:end]).decode("latin-1")
        del self._buffer[:end + 4]
        request = _parse_head(head)
        request.body = await self._read_body(request)
        return request

    async def _read_body(self, request: Request) -> bytes:
        headers = request.headers
        if "transfer-encoding" in headers:
            if "content-length" in headers:
                raise Unreadable(400, "a request may not have both Content-Length and "
                                     "Transfer-Encoding")
            if headers["transfer-encoding"].lower() != "chunked":
                raise Unreadable(501, "only the chunked transfer encoding is supported")
            await self._continue(request)
            return await self._read_chunked()
        length_text = headers.get("content-length", "0").strip()
        if not length_text.isdigit():
            raise Unreadable(400, "Content-Length is not a number")
        length = int(length_text)
        if length > self._limits.max_body_bytes:
            raise Unreadable(413, f"the request body is {length} bytes; the limit is "
                                 f"{self._limits.max_body_bytes}")
        if length:
            await self._continue(request)
        return await self._take(length)

    async def _continue(self, request: Request) -> None:
        """curl and others wait for this before sending a larger body."""
        if request.headers.get("expect", "").lower() == "100-continue" and not self._buffer:
            self._writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self._writer.drain()

    async def _take(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if self._eof:
                raise Unreadable(400, "the connection closed in the middle of a request body")
            await self._fill()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def _line(self) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > 1024:
                raise Unreadable(400, "a malformed chunk in the request body")
            if self._eof:
                raise Unreadable(400, "the connection closed in the middle of a request body")
            await self._fill()
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 2]
        return line

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_text = (await self._line()).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise Unreadable(400, "a malformed chunk size in the request body") from None
            if size < 0:
                raise Unreadable(400, "a malformed chunk size in the request body")
            if size == 0:
                while await self._line():  # trailers, up to the empty line
                    pass
                return bytes(body)
            if len(body) + size > self._limits.max_body_bytes:
                raise Unreadable(413, f"the request body is over the limit of "
                                     f"{self._limits.max_body_bytes} bytes")
            body += await self._take(size)
            if await self._take(2) != b"\r\n":
                raise Unreadable(400, "a malformed chunk in the request body")

    # -- watching for the client leaving ------------------------------------------------------

    def watch(self) -> None:
        """From now on, set ``gone`` when the client closes its end (while its request waits or
        streams). Bytes it sends meanwhile (a pipelined request) are kept, up to a limit."""
        if self._watcher is None and not self._eof:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        try:
            while not self._eof and len(self._buffer) <= MAX_HEAD_BYTES + self._limits.max_body_bytes:
                await self._fill()
        except (ConnectionError, OSError):
            self._eof = True
        if self._eof:
            self._went()

    def when_gone(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop) once the client has gone; at once if it has."""
        if self.gone.is_set():
            callback()
        else:
            self._on_gone.append(callback)

    def forget(self, callback: Callable[[], None]) -> None:
        """No longer call ``callback`` (its request is answered; the connection may serve more)."""
        if callback in self._on_gone:
            self._on_gone.remove(callback)

    def _went(self) -> None:
        if self.gone.is_set():
            return
        self.gone.set()
        callbacks, self._on_gone = self._on_gone, []
        for callback in callbacks:
            callback()

    async def unwatch(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    # -- writing ------------------------------------------------------------------------------

    async def send(self, status: int, body: bytes, content_type: str = "application/json",
                   headers: dict[str, str] | None = None) -> None:
        """A whole response."""
        extra = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
        self.responded = True
        await self._write(self._head(status, extra) + body)

    async def start_stream(self, status: int, content_type: str,
                           headers: dict[str, str] | None = None) -> None:
        """The head of a streamed response; ``write`` its pieces, then ``end_stream``."""
        self._chunked = self.keep_alive
        extra = {"Content-Type": content_type, "Cache-Control": "no-cache",
                 "X-Accel-Buffering": "no", **(headers or {})}
        if self._chunked:
            extra["Transfer-Encoding"] = "chunked"
        else:
            self.keep_alive = False  # an HTTP/1.0 client: the end of the stream is the close
        self.responded = True
        await self._write(self._head(status, extra))

    async def write(self, data: bytes) -> None:
        if data:
            await self._write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)

    async def end_stream(self) -> None:
        if self._chunked:
            await self._write(b"0\r\n\r\n")

    def _head(self, status: int, headers: dict[str, str]) -> bytes:
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {status} {reason}", f"Date: {formatdate(usegmt=True)}",
                 "Server: localchat", f"Connection: {'keep-alive' if self.keep_alive else 'close'}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _write(self, data: bytes) -> None:
        if self._writer.is_closing():
            self._went()
            raise ConnectionResetError("the client has gone")
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError):
            self._went()
            raise

    def hang_up(self) -> None:
        """Close the connection now (an idle one, when the server stops): its read ends."""
        self._writer.close()

    async def close(self) -> None:
        await self.unwatch()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def _parse_head(head: str) -> Request:
    request_line, *header_lines = head.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].startswith("/"):
        raise Unreadable(400, "a malformed request line")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise Unreadable(400, "a malformed header line")
        name = name.lower()
        if name in headers:
            if name in ("host", "content-length", "transfer-encoding", "authorization"):
                raise Unreadable(400, f"the {name} header is repeated")
            headers[name] += ", " + value.strip()
        else:
            headers[name] = value.strip()
    if parts[2] == "HTTP/1.1" and "host" not in headers:
        raise Unreadable(400, "the Host header is missing")
    return Request(parts[0], parts[1], parts[2], headers)


Handler = Callable[[Request, Connection], Awaitable[None]]


async def serve_connection(connection: Connection, handler: Handler,
                           on_error: Callable[[Connection, Unreadable], Awaitable[None]]) -> None:
    """Answer the requests of one connection in turn until it closes, idles out or fails."""
    try:
        while connection.keep_alive:
            try:
                request = await connection.next_request()
            except Unreadable as exc:
                connection.keep_alive = False
                await on_error(connection, exc)
                break
            if request is None:
                break
            connection.keep_alive = request.keep_alive
            connection.busy, connection.responded = True, False
            try:
                await handler(request, connection)
            finally:
                connection.busy = False
            await connection.unwatch()
            if connection.gone.is_set():
                break
    except (ConnectionError, OSError):
        pass  # the client went away; nothing to answer
    finally:
        await connection.close()
