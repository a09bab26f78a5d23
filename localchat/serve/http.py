"""HTTP/1.1 over asyncio streams: the part of a web server that ``localchat serve`` needs, and
nothing it does not (no TLS, no upgrades, no multipart).

Requests are read by h11 (a well-kept HTTP/1.1 parser: Content-Length and chunk sizes in ASCII
digits only, one framing per request, the Host rules, no hand-made parsing that a Unicode digit
or a ``0x`` chunk size gets past), one parser per request, its unread bytes (a pipelined
request) kept for the next. What h11 lets through and a local server refuses is checked here:
both framings at once, a repeated Host, Content-Length or Authorization, a target that is not
a path, another HTTP version. Anything the client sent that cannot be read is an ``Unreadable``
(one line, the connection closed), never a traceback.

Why asyncio streams and not starlette/uvicorn: the limits a local server must hold against a
hostile page or a stuck client are the protocol's own, and here each is one line in one place:
a request's head and body must arrive within ``request_timeout_s`` of its first byte (slowloris),
an idle keep-alive connection is closed after ``idle_timeout_s``, a body over ``max_body_bytes``
is refused (413) before it is read, a head over 64 KiB gets 431, and a client that goes away is
seen at once (``Connection.gone``) while its request waits or streams, without reading a byte
of a request it may have pipelined behind. uvicorn has no deadline for a request's head or body,
and a body cap and disconnect watching would be middleware around it; none of it adds a hop per
streamed token here. Responses are written here as they always were.

A handler gets a :class:`Request` and answers through its :class:`Connection`: ``send`` a whole
response, or ``start_stream`` and ``write`` chunks (``Transfer-Encoding: chunked``, so the
connection stays usable afterwards). Header names are lower-case.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

import h11

from localchat.serve.http_errors import Unreadable

log = logging.getLogger(__name__)

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
        self.idle_since: float | None = None  # waiting for its next request since (monotonic)
        self.responded = False  # this request's response head has been written
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    # -- reading ------------------------------------------------------------------------------

    async def next_request(self) -> Request | None:
        """The next request; None when the client closed the connection or left it idle. Raises
        Unreadable for one that is malformed, too large or too slow."""
        if not self._buffer:
            self.idle_since = time.monotonic()
            try:
                await asyncio.wait_for(self._fill(), self._limits.idle_timeout_s)
            except TimeoutError:
                return None
            finally:
                self.idle_since = None
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
        """One request as h11 reads it from the buffer (and what arrives), its unread bytes (a
        pipelined request) back in the buffer."""
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        request: Request | None = None
        body = bytearray()
        continued = False
        while True:
            self._feed(parser)
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                raise _unreadable(exc) from None
            if event is h11.NEED_DATA:
                if self._eof:
                    where = "request" if request is None else "request body"
                    raise Unreadable(400, f"the connection closed in the middle of a {where}")
                waiting = request is not None and parser.they_are_waiting_for_100_continue
                if waiting and not continued:  # curl and others wait for it to send a body
                    continued = True
                    self._writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await self._writer.drain()
                await self._fill()
            elif isinstance(event, h11.Request):
                request = self._checked(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self._limits.max_body_bytes:
                    raise Unreadable(413, f"the request body is over the limit of "
                                         f"{self._limits.max_body_bytes} bytes")
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                unread, closed = parser.trailing_data
                self._buffer[:0] = unread
                self._eof = self._eof or closed
                request.body = bytes(body)
                return request
            else:  # ConnectionClosed (or PAUSED) before the request ended
                raise Unreadable(400, "the connection closed in the middle of a request")

    def _feed(self, parser: h11.Connection) -> None:
        """Hand what the buffer holds to ``parser`` (and the end of the stream, once seen)."""
        if self._buffer:
            parser.receive_data(bytes(self._buffer))
            self._buffer.clear()
        if self._eof and not parser.trailing_data[1]:
            parser.receive_data(b"")

    def _checked(self, event: h11.Request) -> Request:
        """``event`` as a Request, refused (Unreadable) where h11 lets through what this server
        does not take: a head over MAX_HEAD_BYTES, another HTTP version, a target that is not a
        path, a header that matters given twice, both framings, a body over the cap."""
        version = "HTTP/" + event.http_version.decode("ascii")
        target = event.target.decode("latin-1")
        if version not in ("HTTP/1.1", "HTTP/1.0") or not target.startswith("/"):
            raise Unreadable(400, "a malformed request line")
        head_bytes = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
        if head_bytes > MAX_HEAD_BYTES:
            raise Unreadable(431, "the request's headers are too large")
        headers: dict[str, str] = {}
        for raw_name, raw_value in event.headers:
            name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
            if name in headers:
                if name in _SINGLE_HEADERS:
                    raise Unreadable(400, f"the {name} header is repeated")
                headers[name] += ", " + value
            else:
                headers[name] = value
        if "transfer-encoding" in headers and "content-length" in headers:
            raise Unreadable(400, "a request may not have both Content-Length and "
                                 "Transfer-Encoding")
        length = int(headers.get("content-length", "0"))  # h11 took only ASCII digits
        if length > self._limits.max_body_bytes:
            raise Unreadable(413, f"the request body is {length} bytes; the limit is "
                                 f"{self._limits.max_body_bytes}")
        return Request(event.method.decode("ascii"), target, version, headers)

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


# Headers whose second copy would leave it open which one counts (the key, the framing).
_SINGLE_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "authorization"})

# h11's words for what it refuses, in this server's (the rest: "a malformed request: ...").
_H11_WORDS = {
    "bad Content-Length": "Content-Length is not a number",
    "conflicting Content-Length headers": "the content-length header is repeated",
    "Found multiple Host: headers": "the host header is repeated",
    "Missing mandatory Host: header": "the Host header is missing",
    "illegal request line": "a malformed request line",
    "illegal header line": "a malformed header line",
    "Only Transfer-Encoding: chunked is supported": "only the chunked transfer encoding is "
                                                    "supported",
}


def _unreadable(exc: h11.RemoteProtocolError) -> Unreadable:
    """h11's refusal as this server answers it: its status (400, 431 for a head too large, 501
    for a transfer coding), in one line without the bytes it quotes."""
    if exc.error_status_hint == 431:
        return Unreadable(431, "the request's headers are too large")
    words = str(exc).split(": bytearray(", 1)[0]
    if words.startswith("peer"):  # "peer unexpectedly closed connection", "peer closed ..."
        return Unreadable(400, "the connection closed in the middle of a request")
    chunk = words.startswith(("illegal chunk", "malformed chunk"))
    message = ("a malformed chunk in the request body" if chunk
               else _H11_WORDS.get(words, f"a malformed request: {words}"))
    return Unreadable(exc.error_status_hint, message)


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
            except Exception:  # a bug in reading: one answer, the traceback in the log only
                log.exception("reading a request from %s failed", connection.peer)
                connection.keep_alive = False
                await on_error(connection, Unreadable(400, "the request could not be read"))
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
