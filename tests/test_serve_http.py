"""``localchat serve``'s HTTP/1.1 reading (``serve.http``) on real sockets, without a model: a
handler that echoes what it read, behind the same connection loop the server runs. Pipelined
requests, Expect: 100-continue, chunked bodies, and every framing a proxy and this server could
read apart (smuggling) or that a hand-made reader got wrong: refused with one status and the
connection closed, never a traceback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from serve_fixtures import read_response

from localchat.serve.http import Connection, Limits, Request, serve_connection
from localchat.serve.http_errors import Unreadable

LIMITS = Limits(max_body_bytes=4096, request_timeout_s=1.0, idle_timeout_s=5.0)


class Echo:
    """A server whose every answer is the request as it was read; ``port`` once started."""

    port = 0

    async def handle(self, request: Request, connection: Connection) -> None:
        body = {"method": request.method, "target": request.target, "version": request.version,
                "headers": request.headers, "body": request.body.decode("latin-1")}
        await connection.send(200, json.dumps(body).encode())

    async def unreadable(self, connection: Connection, error: Unreadable) -> None:
        await connection.send(error.status, json.dumps({"error": error.message}).encode())

    async def serve(self, ready: threading.Event, stop: asyncio.Event) -> None:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await serve_connection(Connection(reader, writer, LIMITS), self.handle, self.unreadable)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        await stop.wait()
        server.close()


@pytest.fixture(scope="module")
def echo() -> Iterator[Echo]:
    server, ready = Echo(), threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(ready, stop),),
                              daemon=True)
    thread.start()
    assert ready.wait(10)
    yield server
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


@contextmanager
def connected(server: Echo) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        yield sock


def exchange(server: Echo, data: bytes) -> tuple[int, dict]:
    """Send ``data``; the status and JSON body of the one answer."""
    with connected(server) as sock:
        sock.sendall(data)
        status, _, body = read_response(sock)
    return status, json.loads(body)


def closed_after(sock: socket.socket) -> bool:
    """Whether the server closed the connection (after the answer already read)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_request_is_read_with_its_headers_and_body(echo):
    status, read = exchange(echo, b"POST /v1/x?a=1 HTTP/1.1\r\nHost: localhost\r\n"
                                  b"X-Thing:  both  \r\nContent-Length: 5\r\n\r\nhello")
    assert status == 200 and read["body"] == "hello" and read["target"] == "/v1/x?a=1"
    assert read["headers"]["x-thing"] == "both" and read["version"] == "HTTP/1.1"


def answers_until_closed(sock: socket.socket) -> list[dict]:
    """The JSON bodies of every answer the server sends before it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    bodies = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        bodies.append(json.loads(data[:length]))
        data = data[length:]
    return bodies


def test_pipelined_requests_are_answered_in_order_on_one_connection(echo):
    with connected(echo) as sock:
        sock.sendall(b"POST /one HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                     b"GET /two HTTP/1.1\r\nHost: a\r\n\r\n"
                     b"POST /three HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n2;ext=1\r\nxy\r\n0\r\nTrailer: t\r\n\r\n")
        read = answers_until_closed(sock)
    assert [r["target"] for r in read] == ["/one", "/two", "/three"]
    assert [r["body"] for r in read] == ["abc", "", "xy"]


def test_expect_100_continue_is_answered_before_the_body_is_sent(echo):
    with connected(echo) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"body")
        status, _, body = read_response(sock)
    assert status == 200 and json.loads(body)["body"] == "body"


def test_http_1_0_needs_no_host_and_closes_after_its_answer(echo):
    with connected(echo) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert read_response(sock)[0] == 200 and closed_after(sock)


@pytest.mark.parametrize("request_bytes, status, says", [
    # smuggling: two framings, or one a proxy would read otherwise
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400, "both Content-Length and Transfer-Encoding"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
     400, "content-length"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "chunked"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nxy\r\n0\r\n\r\n",
     400, "chunk"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n" + b"x" * 16
     + b"\r\n0\r\n\r\n", 400, "chunk"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxyz\r\n0\r\n\r\n",
     400, "chunk"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "host header is repeated"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\r\nAuthorization: Bearer y\r\n\r\n",
     400, "authorization header is repeated"),
    (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400, "header"),
    # request lines
    (b"GET / HTTP/1.1\r\n\r\n", 400, "the Host header is missing"),
    (b"GET http://localhost/health HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "request line"),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 400, "request line"),
    (b"GARBAGE\r\n\r\n", 400, "request line"),
    # sizes
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "too large"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999\r\n\r\n", 413, "4096"),
])
def test_framing_a_proxy_could_read_otherwise_is_refused_and_the_connection_closed(
        echo, request_bytes, status, says):
    with connected(echo) as sock:
        sock.sendall(request_bytes)
        answer, _, body = read_response(sock)
        assert (answer, closed_after(sock)) == (status, True)
    assert says in json.loads(body)["error"]


def test_a_head_or_body_that_stops_arriving_is_a_408(echo):
    for partial in (b"GET / HTTP/1.1\r\nHost: a", b"POST / HTTP/1.1\r\nHost: a\r\n"
                                                  b"Content-Length: 10\r\n\r\nabc"):
        with connected(echo) as sock:
            sock.sendall(partial)
            assert read_response(sock)[0] == 408
