"""The way back to the client of one request (:class:`Responder`): a whole answer, or the head
of a stream and its pieces, each carrying the headers every answer to that request carries (the
CORS headers of an allowed origin, ``safety.Gate.cors_headers``); a ``HEAD`` request gets the
head without the body.
"""

from __future__ import annotations

import json
from typing import Any

from localchat.serve.http import Connection, Request


def json_bytes(body: dict[str, Any]) -> bytes:
    """A JSON body as every answer writes it (UTF-8, not ASCII-escaped)."""
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


class Responder:
    """Answers ``request`` on ``connection``, with ``headers`` on every answer."""

    def __init__(self, request: Request, connection: Connection, headers: dict[str, str]) -> None:
        self.request = request
        self.connection = connection
        self._headers = headers

    async def send(self, status: int, body: bytes, content_type: str,
                   headers: dict[str, str] | None = None) -> None:
        body = b"" if self.request.method == "HEAD" else body
        await self.connection.send(status, body, content_type, {**self._headers, **(headers or {})})

    async def send_json(self, status: int, body: dict[str, Any],
                        headers: dict[str, str] | None = None) -> None:
        await self.send(status, json_bytes(body), "application/json", headers)

    async def start_stream(self, content_type: str) -> None:
        """A 200 whose body follows in pieces (``write``, then ``end_stream``)."""
        await self.connection.start_stream(200, content_type, self._headers)

    async def write(self, data: bytes) -> None:
        await self.connection.write(data)

    async def end_stream(self) -> None:
        await self.connection.end_stream()
