"""One request's reply as both APIs write it: the job's events read on the event loop as text
pieces (reasoning apart from the answer), stop strings applied, and one ending with the finish
reason and timings. A failure before any text is raised (``http_errors.ReplyFailed``), so it can
still be an HTTP error status; ``exchange`` hands what comes here to the API's shape.

Stop strings (OpenAI's and Ollama's ``stop``) end the answer where one first appears: the text
that could be the start of one is held back until it is clear, the stop string itself is never
sent, and the turn is stopped at once (``Job.stop_reply``). They apply to the answer, not to the
reasoning.

A reply that called tools ends with its calls (``Ending.tool_calls``, finish reason
"tool_calls"); the answer text never holds their markers or JSON (the engine keeps them out of
the Tokens). A call that cannot run as written (cut off by the token limit, unreadable, naming
no tool offered, arguments outside the tool's schema: ``call_checks``) is not a call for the
client: its text, without the call's markers, ends the content instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from localchat.events import Done, Failed, Thinking, Timings, Token, TokenLogprob
from localchat.reply.calls import ToolCall
from localchat.serve.call_checks import checked_calls
from localchat.serve.http import Connection
from localchat.serve.http_errors import ApiError, ReplyFailed, ShuttingDown
from localchat.serve.scheduler import Job, Rejected, Started


@dataclass(frozen=True)
class Piece:
    kind: Literal["content", "thinking"]
    text: str
    # The log probabilities of the tokens whose text this piece released (when asked).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class Ending:
    finish_reason: Literal["stop", "length", "tool_calls"]
    timings: Timings
    content: str  # the whole answer sent (stop strings applied)
    thinking: str  # the whole reasoning sent
    load_ms: float = 0.0
    model: str = ""
    error: ApiError | None = None  # the reply was cut (the server shutting down) after text went
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the client is to run
    reply: str = ""  # the reply as the model wrote it (markers and calls included)
    # A completion's prompt and reply tokens (to the stop string's token): Ollama's ``context``.
    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # every answer token's, when asked (pieces' too)


class StopMatcher:
    """Finds the first of ``stops`` in streamed text; releases only text that cannot be the
    start of one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to send, whether a stop string has appeared: nothing after it is sent)."""
        if not self.stops:
            return text, False
        buffer = self._held + text
        found = [i for i in (buffer.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self._held = ""
            return buffer[:min(found)], True
        keep = max((n for stop in self.stops for n in range(min(len(stop) - 1, len(buffer)), 0, -1)
                    if buffer.endswith(stop[:n])), default=0)
        self._held = buffer[len(buffer) - keep:]
        return buffer[:len(buffer) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


GONE = object()  # put on a job's queue when its client has gone


async def read_reply(job: Job, connection: Connection) -> AsyncIterator[Piece | Ending]:
    """The reply's pieces, then its Ending. Raises ReplyFailed for a failure before any piece, and
    ConnectionResetError when the client has gone (the job is cancelled then)."""
    def gone() -> None:
        job.cancel()
        job.events.put_nowait(GONE)  # type: ignore[arg-type]

    connection.when_gone(gone)
    try:
        stops = StopMatcher(job.request.stop)
        content: list[str] = []
        thinking: list[str] = []
        stopped = False
        started = Started("", 0.0)
        sent_any = False
        text_out = False  # the turn heard that its first text was sent
        sampled: list[int] = []  # the reply's tokens sent (a completion's context)
        logprobs: list[TokenLogprob] = []  # every answer token's so far
        released = 0  # how many of them went out with a piece
        while True:
            event = await job.events.get()
            if event is GONE:
                raise ConnectionResetError("the client has gone")
            if isinstance(event, Started):
                started = event
            elif isinstance(event, Rejected):
                raise event.error
            elif isinstance(event, Thinking) and event.text:
                thinking.append(event.text)
                sent_any = True
                yield Piece("thinking", event.text)
            elif isinstance(event, Token) and not stopped:
                if event.logprob is not None:
                    logprobs.append(event.logprob)
                text, stopped = stops.feed(event.text)
                if stopped:
                    job.stop_reply()
                else:
                    sampled.append(event.token_id)
                if text:
                    content.append(text)
                    sent_any = True
                    yield Piece("content", text, tuple(logprobs[released:]))
                    released = len(logprobs)
            elif isinstance(event, Failed):
                if not sent_any:
                    raise ReplyFailed(event.message, event.code)
                yield _ending(event, Timings(), content, thinking, started,
                              ReplyFailed(event.message, event.code))
                return
            elif isinstance(event, Done):
                if not stopped and (rest := stops.flush()):
                    content.append(rest)
                    yield Piece("content", rest, tuple(logprobs[released:]))
                    released = len(logprobs)
                calls, broken = checked_calls(event.tool_calls, job.request.tools)
                if broken and not stopped:
                    if content and not content[-1][-1:].isspace():
                        broken = "\n\n" + broken
                    content.append(broken)
                    yield Piece("content", broken, tuple(logprobs[released:]))
                error = None
                if event.finish_reason == "aborted" and not stopped and job.shutting_down:
                    error = ShuttingDown()
                ending = _ending(event, event.timings, content, thinking, started, error,
                                 stopped, calls)
                ending.tokens = (*started.prompt, *sampled) if started.prompt else ()
                ending.logprobs = tuple(logprobs)
                yield ending
                return
            if not text_out and isinstance(event, (Token, Thinking)) and event.text:
                # Sent, or held back (a stop string may begin there): the turn, held after its
                # first text (``Job.attach``), may decode on.
                job.first_text_sent()
                text_out = True
    finally:
        connection.forget(gone)


def _ending(event: Done | Failed, timings: Timings, content: list[str], thinking: list[str],
            started: Started, error: ApiError | None, stopped: bool = False,
            checked: tuple[ToolCall, ...] = ()) -> Ending:
    if not isinstance(event, Done):
        return Ending("stop", timings, "".join(content), "".join(thinking), started.load_ms,
                      started.model, error)
    calls = () if stopped else checked
    finish: Literal["stop", "length", "tool_calls"] = (
        "tool_calls" if calls else "length" if event.finish_reason == "length" and not stopped
        else "stop")
    return Ending(finish, timings, "".join(content), "".join(thinking), started.load_ms,
                  started.model, error, calls, event.reply)

