"""Streaming chat completions from an OpenAI-compatible server, as the same events a local turn
produces (``Token``…, then one ``Done`` or ``Failed``; ``Notice`` for a retry).

Contract of a :class:`RemoteTurn` (a ``localchat.events.Turn``):

- The request starts when the turn is created; iterating blocks per event.
- ``stop()`` may be called from any thread. It shuts the socket down at once (the server sees the
  connection close within milliseconds, even mid-stall) and the next event is the final one,
  ``Done(finish_reason="aborted", reply=<text received so far>)`` (see ``events.Turn``).
- A failed request is retried at most once, and only while no reply text has arrived; 4xx answers
  other than 408/429 are not retried (they will not change), nor are timeouts (a retry would
  double the wait). A ``Retry-After`` (seconds or an HTTP date) on a retryable answer is waited
  out before that retry when it is at most ``timeout_s`` (the delay a silent server costs before
  the fallback, so the turn's worst case stays the same); a longer one is not retried, and the
  failure says when to try again.
- Each data event must be complete within ``timeout_s`` of the previous one (or of the answer's
  headers): keep-alive comments and the bytes of a line that never ends do not count, so a
  trickling server fails like a silent one. A line or event over ``sse.MAX_EVENT_BYTES`` fails
  at once, without reading the rest. Neither is retried.
- A 2xx answer is read only if it is an event stream of chat-completion chunks that carry text
  (``stream_checks``): a web page, a whole JSON reply, an empty body, events without ``choices``
  or an empty reply fail in one line that names what came, and are not retried.
- A server that goes on past the request's ``max_tokens`` is cut there (``stream_checks``): what
  fits is kept, a ``Notice`` says so, and the turn ends with finish_reason "length".
- A turn with an answer shape asks for it in the request (``response_format``: OpenAI's
  ``json_schema``, or ``json_object`` for any JSON). A server that refuses ``json_schema`` by
  name (llama-cpp-python's answers 500 "Input should be 'text' or 'json_object'") is asked again
  at once in its older form, ``{"type": "json_object", "schema": ...}``, and so for the rest of
  the session; that is not the turn's one retry. The answer is checked by whoever asked for it.
- Every failure is one ``Failed`` line written for the user; it never contains the API key.
- The circuit breaker learns the outcome of each turn (a stopped turn teaches it nothing).
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from localchat import logs
from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.events import (
    Done,
    Event,
    Failed,
    FinishReason,
    Notice,
    Thinking,
    Timings,
    Token,
    TurnEnd,
)
from localchat.remote import failures
from localchat.remote.breaker import CircuitBreaker
from localchat.remote.image_wire import with_images
from localchat.remote.sse import (
    RemoteStreamError,
    StreamTooLarge,
    decode_chunk,
    error_text,
    iter_lines,
    iter_sse_data,
)
from localchat.remote.stream_checks import TokenLimit, no_reply, not_a_stream, opening
from localchat.remote.timing import ReplyClock
from localchat.remote.tool_wire import CallAssembler, tool_fields, wire_messages
from localchat.reply.reasoning import ReasoningSplitter, join_reply
from localchat.settings.remote import RemoteSettings

log = logging.getLogger(__name__)

_STOPPED = object()  # queue marker: stop() was called
_RETRYABLE_STATUS = {408, 429}
_ERROR_BODY_BYTES = 64 * 1024  # of a non-200 answer: enough for any error object, and a bound
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length",
                                             "tool_calls": "stop", "function_call": "stop"}


class RemoteOff(UserError):
    """A remote request was asked for while ``[remote]`` is off or has no base_url."""


class RemoteClient:
    """Sends turns to one OpenAI-compatible server. Construct it only when the remote is enabled:
    with ``mode = "off"`` or no ``base_url`` the constructor refuses, so no code path can reach
    the network."""

    def __init__(self, settings: RemoteSettings, *, breaker: CircuitBreaker | None = None) -> None:
        if not settings.enabled:
            raise RemoteOff('the remote model is off: set [remote] mode = "ask" or "auto" and '
                            "base_url in config.toml")
        self.settings = settings
        # Set once a server refused OpenAI's "json_schema" response_format and took the older
        # {"type": "json_object", "schema": ...} (llama-cpp-python's server, Anyscale): the
        # session's later turns ask in that form at once.
        self.schema_dialect: str | None = None
        self.breaker = breaker or CircuitBreaker(
            settings.breaker_failures, settings.breaker_cooldown_s, base_url=settings.base_url)
        # No keep-alive: stop() must be able to shut a socket down at any moment, and httpcore
        # reveals a connection's socket only when it opens one (the "trace" extension). A reused
        # connection would hide it until the headers arrive. One handshake per remote turn,
        # which lasts seconds anyway, is the price.
        self._http = httpx.Client(
            timeout=httpx.Timeout(settings.timeout_s),
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def stream(self, messages: list[dict], sampling: Sampling | None = None, *,
               route_reason: str = "") -> RemoteTurn:
        """Start a turn with ``messages`` (already trimmed to the remote's budget; a message's
        ``images`` are sent as ``[remote] images`` says)."""
        # Pictures become image_url parts only for a remote configured to read them; for any
        # other, not one image byte goes out (image_wire).
        sent = wire_messages(with_images(messages, reads_images=self.settings.images))
        return RemoteTurn(self, self._request_body(sent, sampling or Sampling()), route_reason)

    @property
    def where(self) -> str:
        """The server as an error message names it: host[:port], never a user:password part."""
        parts = urlsplit(self.settings.base_url)
        try:
            port = parts.port
        except ValueError:
            port = None
        return f"{parts.hostname or '?'}:{port}" if port else parts.hostname or "?"

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        model = self.settings.model or "?"
        return f"<RemoteClient {self.settings.base_url} model={model} {self.breaker!r}>"

    def _request_body(self, messages: list[dict], sampling: Sampling) -> dict[str, Any]:
        # Only parameters the OpenAI API defines: hosted APIs reject unknown ones (top_k, min_p).
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self.settings.max_tokens or sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if self.settings.model:
            body["model"] = self.settings.model
        if sampling.seed >= 0:  # a negative seed is random
            body["seed"] = sampling.seed
        body.update(tool_fields(sampling.tools, sampling.tool_choice))
        if sampling.response_format is not None:
            body["response_format"] = (sampling.response_format if self.schema_dialect is None
                                       else schema_dialect(sampling.response_format))
        return body

    def _post_stream(self, body: dict[str, Any], trace: Callable[[str, dict], None]):
        """The streaming POST as a context manager yielding the httpx response."""
        key = self.settings.api_key()  # read now: the key is never stored on an object
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return self._http.stream("POST", self.settings.chat_url, json=body, headers=headers,
                                 extensions={"trace": trace})


class _AttemptFailed(Exception):
    def __init__(self, message: str, retryable: bool, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s  # the server's Retry-After, when it sent one


class RemoteTurn(TurnEnd):
    """One streamed remote reply. Iterate for events; ``stop()`` from any thread. The final
    event is set by the request's thread, or by the reader when ``stop()`` came first."""

    def __init__(self, client: RemoteClient, body: dict[str, Any], route_reason: str) -> None:
        super().__init__()
        self._client = client
        self._body = body
        self._route_reason = route_reason
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._clock = ReplyClock()
        self._model = client.settings.model
        self._last_data = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="remote-turn", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Event]:
        return self._read(self._produced())

    def _produced(self) -> Iterator[Event]:
        reply: list[str] = []
        thinking: list[str] = []
        while True:
            item = self._events.get()
            if item is _STOPPED:
                reasoning = "".join(thinking)
                # The request's thread may have ended the turn just before the stop: its
                # final event stands.
                yield self._finish(Done(join_reply(reasoning, "".join(reply)), "aborted",
                                        self._timings(None, None), reasoning))
                return
            if isinstance(item, Token):
                reply.append(item.text)
            elif isinstance(item, Thinking):
                thinking.append(item.text)
            yield item
            if isinstance(item, (Done, Failed)):
                return

    def stop(self) -> None:
        """Abort: close the connection now; the iterator ends with Done(aborted)."""
        if self._stop.is_set():
            return
        self._stop_reading()
        self._stop.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)
        self._events.put(_STOPPED)

    def __repr__(self) -> str:
        state = "stopped" if self._stop.is_set() else "running" if self._thread.is_alive() else "ended"
        return f"<RemoteTurn {state} {len(self._clock.arrivals)} chunks>"

    # -- worker thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            final = self._attempt_twice()
        except Exception as exc:  # a bug must still end the turn, or the iterator would hang
            logs.attach()  # its traceback goes to the log file, not the terminal
            log.exception("remote turn crashed")
            final = Failed(self._redact(f"remote client error: {type(exc).__name__}: {exc}"))
        if final is None or self._stop.is_set():
            return  # the iterator already ended with Done(aborted); the breaker learns nothing
        if isinstance(final, Failed):
            self._client.breaker.record_failure()
        else:
            self._client.breaker.record_success()
        self._events.put(self._finish(final))

    def _attempt_twice(self) -> Done | Failed | None:
        """The turn's final event, or None when it was stopped."""
        for attempt in (1, 2):
            try:
                return self._attempt()
            except _AttemptFailed as exc:
                if self._stop.is_set():
                    return None
                message = self._redact(str(exc))
                wait = exc.retry_after_s or 0.0
                if wait > self._client.settings.timeout_s or not (
                        attempt == 1 and exc.retryable and not self._clock.arrivals):
                    return Failed(message + failures.try_again_hint(exc.retry_after_s))
                later = f" in {failures.seconds(wait)} s (Retry-After)" if wait else ""
                self._events.put(Notice(f"{message}; retrying once{later}", kind="retry"))
                if self._stop.wait(wait):
                    return None
        raise AssertionError("unreachable")

    def _attempt(self) -> Done:
        try:
            with self._client._post_stream(self._body, self._trace) as response:
                if not response.is_success:
                    failure = self._status_failure(response)
                    if not self._asks_in_another_dialect(response.status_code, str(failure)):
                        raise failure
                else:
                    return self._read_stream(response)
            with self._client._post_stream(self._body, self._trace) as response:
                if not response.is_success:
                    raise self._status_failure(response)
                return self._read_stream(response)
        except httpx.TimeoutException as exc:
            # Not retried: a second wait as long as the first would double the user's delay
            # before the local fallback (a silent server cost 2 × timeout_s + 1 s).
            message = failures.timeout_message(exc, self._client.settings.timeout_s)
            raise _AttemptFailed(message, False) from None
        except httpx.ConnectError as exc:
            raise _AttemptFailed(f"cannot connect to the remote: {failures.reason(exc)}", True) from None
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            raise _AttemptFailed(f"connection to the remote dropped: {failures.reason(exc)}", True) from None
        except httpx.HTTPError as exc:
            raise _AttemptFailed(f"remote request failed: {failures.reason(exc)}", False) from None

    def _asks_in_another_dialect(self, status: int, message: str) -> bool:
        """After a refusal that names the json_schema response_format: the body now asks for
        the schema in the older json_object form (True), to be sent at once. Once per turn."""
        asked = self._body.get("response_format")
        if (not isinstance(asked, dict) or asked.get("type") != "json_schema" or status < 400
                or not any(word in message for word in ("response_format", "json_schema"))):
            return False
        self._body = {**self._body, "response_format": schema_dialect(asked)}
        self._client.schema_dialect = "json_object"
        log.info("the remote refused response_format json_schema; asking with json_object")
        return True

    def _read_stream(self, response: httpx.Response) -> Done:
        where = self._client.where
        body = self._within_deadline(response.iter_bytes())
        head = opening(body)
        problem = not_a_stream(where, response.status_code,
                               response.headers.get("content-type", ""), head)
        if problem:
            raise _AttemptFailed(problem, False)  # the same server would answer the same again
        reply: list[str] = []
        thinking: list[str] = []
        calls = CallAssembler()  # streamed tool_calls deltas
        # Reasoning arrives apart (reasoning_content) or inline as <think> in the content.
        inline = ReasoningSplitter()
        limit = TokenLimit(self._body["max_tokens"])
        finish_reason: str | None = None
        usage = None
        events = chat_chunks = 0
        first_event = ""
        ended = False  # by [DONE] or the cut at max_tokens
        payloads = iter_sse_data(iter_lines(itertools.chain([head], body)))
        for payload in _bounded(payloads, where):
            self._last_data = time.monotonic()
            try:
                chunk = decode_chunk(payload)
            except RemoteStreamError as exc:
                # An error object is the server's own report (often transient); garbage is not.
                raise _AttemptFailed(str(exc), str(exc).startswith("remote error")) from None
            if chunk.done:
                ended = True
                break
            events, chat_chunks = events + 1, chat_chunks + chunk.chat
            first_event = first_event or payload
            text = chunk.reasoning + chunk.content
            fits = limit.room(text)
            if limit.passed:  # the server went past max_tokens: keep what fits, then stop
                chunk = replace(chunk, reasoning=chunk.reasoning[:fits],
                                content=chunk.content[:max(0, fits - len(chunk.reasoning))],
                                finish_reason="length")
            self._model = self._client.settings.model or chunk.model or self._model
            usage = chunk.usage or usage
            finish_reason = chunk.finish_reason or finish_reason
            if chunk.tool_deltas:
                calls.feed(chunk.tool_deltas)
            if chunk.reasoning:
                self._reasoning(chunk.reasoning, thinking)
            if chunk.content:
                reasoning, answer = inline.feed(chunk.content)
                self._reasoning(reasoning, thinking)
                self._answer(answer, reply)
            if limit.passed:
                ended = True
                break
        reasoning, answer = inline.flush()
        self._reasoning(reasoning, thinking)
        self._answer(answer, reply)
        if limit.passed and (reply or thinking):
            self._events.put(Notice(
                f"the remote at {where} went on past the {limit.max_tokens} tokens asked for "
                "(max_tokens); its reply was cut there", kind="max_tokens"))
        if events and not chat_chunks or (ended or finish_reason) and not (reply or thinking
                                                                           or calls):
            # Not a chat stream, or an empty reply: never stored as one, and not worth a retry.
            raise _AttemptFailed(no_reply(where, events, chat_chunks, first_event), False)
        if not ended and finish_reason is None:
            raise _AttemptFailed("the remote closed the stream before the reply was complete", True)
        timings = self._timings(usage.prompt_tokens if usage else None,
                                usage.completion_tokens if usage else None)
        reasoning = "".join(thinking)
        finish = _FINISH_REASONS.get(finish_reason or "stop", "stop")
        return Done(join_reply(reasoning, "".join(reply)), finish, timings, reasoning,
                    tool_calls=calls.calls(complete=finish != "length"))

    def _reasoning(self, text: str, thinking: list[str]) -> None:
        if text:
            self._clock.text_arrived(thinking=True)
            thinking.append(text)
            self._events.put(Thinking(text))

    def _answer(self, text: str, reply: list[str]) -> None:
        if text:
            self._clock.text_arrived()
            reply.append(text)
            self._events.put(Token(text))

    def _within_deadline(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """The body's bytes, failing once ``timeout_s`` passes without a complete data event:
        the read timeout is per read, so it never fires on a server that keeps sending
        keep-alive comments, or a line a few bytes at a time that never ends."""
        timeout = self._client.settings.timeout_s
        self._last_data = time.monotonic()
        for data in chunks:
            if time.monotonic() - self._last_data > timeout:
                raise _AttemptFailed(
                    f"the remote at {self._client.where} sent no complete event for {timeout:g} s "
                    "(timeout_s): only keep-alives or a line that never ends", False)
            yield data

    def _status_failure(self, response: httpx.Response) -> _AttemptFailed:
        text = failures.read_at_most(response, _ERROR_BODY_BYTES)
        try:
            detail = error_text(json.loads(text).get("error") or text)
        except (ValueError, AttributeError):
            detail = error_text(text or response.reason_phrase)
        message = f"remote answered {response.status_code}: {detail}"
        if response.status_code in (401, 403):
            env = self._client.settings.api_key_env
            message += f" (check the key in ${env})" if env else " (set api_key_env in [remote])"
        retryable = response.status_code >= 500 or response.status_code in _RETRYABLE_STATUS
        wait = failures.retry_after_s(response.headers.get("retry-after"))
        return _AttemptFailed(message, retryable, wait)

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        # httpcore reports each new connection; keep its socket so stop() can shut it down.
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
        if self._stop.is_set():
            _shut(sock)

    def _timings(self, prompt_n: int | None, predicted_n: int | None) -> Timings:
        return self._clock.timings(prompt_n=prompt_n, predicted_n=predicted_n, route="remote",
                                   route_reason=self._route_reason, model=self._model)

    def _redact(self, message: str) -> str:
        key = self._client.settings.api_key()
        return message.replace(key, "***") if key else message


def schema_dialect(response_format: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``{"type": "json_schema", "json_schema": {"schema": S}}`` as the older
    ``{"type": "json_object", "schema": S}`` that llama-cpp-python's server takes."""
    schema = (response_format.get("json_schema") or {}).get("schema")
    if response_format.get("type") != "json_schema" or schema is None:
        return response_format
    return {"type": "json_object", "schema": schema}


def _shut(sock: socket.socket) -> None:
    # shutdown(), not close(): on Linux closing a descriptor does not wake a thread blocked in
    # recv() on it, and the peer would see nothing until that read returned. The plain socket
    # method also for TLS sockets: SSLSocket.shutdown would drop the SSL object under the feet of
    # the thread still reading through it.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, or detached when TLS wrapped it (the TLS socket is shut instead)


def _bounded(payloads: Iterator[str], where: str) -> Iterator[str]:
    """``payloads``, with a line or event over the size cap as a failure naming the remote."""
    try:
        yield from payloads
    except StreamTooLarge as exc:
        raise _AttemptFailed(f"the remote at {where} sent {exc}; no chat stream needs that",
                             False) from None
