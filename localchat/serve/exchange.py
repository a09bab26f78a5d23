"""One chat exchange, whichever API asked: the request queued as a job, its reply read as pieces
(``pieces.read_reply``) and streamed or gathered in the API's shape, and a reply that called
tools remembered so the client's next request renders it as the model wrote it
(``tool_fields.RawCalls``).

As llama-server picks ``to_json_oaicompat_chat_stream()`` or ``..._chat()`` by the response
type fixed at parse time, one loop here serves every API: an API module gives a
:class:`ReplyShape` (how one reply's pieces, ending and errors are written) and nothing else.

A request is read (its JSON parsed, its fields checked, an answer format's schema turned into a
grammar: up to seconds) on the exchange's reading thread (``Exchange.read``), one request after
another in arrival order, so the event loop answers ``/health`` and every other client meanwhile.

A failure before the first piece is raised (an ``http_errors.ApiError``) while the answer can still
be an HTTP error; after it, the shape writes it as the stream's last event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from localchat.serve.chat_request import ChatRequest
from localchat.serve.fields import json_object
from localchat.serve.http import Connection
from localchat.serve.http_errors import ShuttingDown
from localchat.serve.model_host import ModelHost, ServedModel
from localchat.serve.pieces import Ending, Piece, read_reply
from localchat.serve.request_images import check_model_reads
from localchat.serve.respond import Responder
from localchat.serve.scheduler import Job, Scheduler
from localchat.serve.tool_fields import RawCalls


class ReplyShape(Protocol):
    """How one API writes one reply (made per request: ``openai_api.ChatShape``,
    ``ollama_api.ChatShape``)."""

    stream_type: str  # the Content-Type of a streamed reply

    def opening(self) -> bytes:
        """What a stream begins with, before any piece (may be empty)."""
        ...

    def piece(self, piece: Piece) -> bytes:
        """One piece of a streamed reply."""
        ...

    def ending(self, ending: Ending) -> list[bytes]:
        """A stream's last writes, each sent as it is (its calls, its end or its error)."""
        ...

    def whole(self, ending: Ending) -> dict[str, Any]:
        """The body of a reply that is not streamed."""
        ...


ShapeFor = Callable[[ChatRequest, ServedModel], ReplyShape]
T = TypeVar("T")
ParseChat = Callable[[dict[str, Any]], ChatRequest]  # an API's parse_chat (or a completion's parse)


class Exchange:
    """Runs chat requests on the model host (one at a time, ``scheduler``) and answers them."""

    def __init__(self, host: ModelHost, max_queue: int) -> None:
        self.host = host
        self.scheduler = Scheduler(host, max_queue)
        self.raw_calls = RawCalls()
        # One thread: requests are read in the order they arrived (and a client sending heavy
        # schemas takes one core, not all of them).
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="localchat-serve-read")
        self._closed = False

    async def read(self, parse: Callable[[dict[str, Any]], T], body: bytes) -> T:
        """``parse`` of ``body`` as a JSON object, on the reading thread (BadRequest naming the
        field, as ``parse`` raises it)."""
        if self._closed:
            raise ShuttingDown()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, lambda: parse(json_object(body)))

    def close(self) -> None:
        """Stop the reading thread (once the server no longer listens)."""
        self._closed = True
        self._reader.shutdown(wait=False, cancel_futures=True)

    def start_job(self, chat: ChatRequest, connection: Connection) -> Job:
        """Queue ``chat`` (its tool rounds as the model wrote them) for the model it names
        (NotFound, Busy, ShuttingDown), and watch for its client leaving while it waits or
        streams. (On the event loop.)"""
        restored = replace(chat, messages=self.raw_calls.restore(chat.messages))
        model = self.host.resolve_chat(chat.model)
        check_model_reads(model, restored.messages)
        job = Job(restored, model, asyncio.get_running_loop())
        self.scheduler.submit(job)
        connection.watch()
        return job

    async def answer(self, chat: ChatRequest, shape_for: ShapeFor, out: Responder) -> None:
        """Run ``chat`` and answer it in the shape ``shape_for`` makes, streamed if it asks."""
        job = self.start_job(chat, out.connection)
        shape = shape_for(job.request, job.model)
        if chat.stream:
            await self._stream(job, shape, out)
        else:
            await self._gather(job, shape, out)

    async def _stream(self, job: Job, shape: ReplyShape, out: Responder) -> None:
        started = False
        async for item in read_reply(job, out.connection):
            if not started:  # only now: a failure before the first piece is still an HTTP error
                await out.start_stream(shape.stream_type)
                await out.write(shape.opening())
                started = True
            if isinstance(item, Piece):
                await out.write(shape.piece(item))
                continue
            self._remember(item)
            for data in shape.ending(item):
                await out.write(data)
            await out.end_stream()

    async def _gather(self, job: Job, shape: ReplyShape, out: Responder) -> None:
        async for item in read_reply(job, out.connection):
            if not isinstance(item, Ending):
                continue
            if item.error is not None:
                raise item.error
            self._remember(item)
            await out.send_json(200, shape.whole(item))

    def _remember(self, ending: Ending) -> None:
        if ending.error is None:
            self.raw_calls.remember(ending.content, ending.tool_calls, ending.reply)
