"""TurnHandle: how a caller receives one local turn's events (a ``localchat.events.Turn``), from
any thread, without blocking the engine; and the clock that turns token timestamps into the
turn's Timings."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from localchat.events import Done, Event, Failed, Thinking, Timings, Token, TokenLogprob, TurnEnd
from localchat.percentiles import percentile
from localchat.reply.call_stream import ToolCallSplitter
from localchat.reply.calls import ToolCall
from localchat.reply.reasoning import ReasoningSplitter

if TYPE_CHECKING:
    from localchat.engine.sampling.confidence import TokenStats


class Outbox:
    """Events held back while their producer works on, all handed on at once when it is done
    (``collecting``): the engine thread stepping every slot's reply on (``engine.slots``) wakes
    each turn's reader only as it begins the next decode, which lets go of the GIL. A reader
    woken by each event took the GIL whenever the stepping let go of it for a moment (numpy's
    argmax does): 130 us an argmax instead of 14, in ``serve`` with 4 slots."""

    def __init__(self) -> None:
        self._owner: int | None = None  # the thread whose events wait, while it collects
        self._held: list[tuple[Callable[[Event], None], Event]] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self.release()

    def take(self, put: Callable[[Event], None], event: Event) -> bool:
        """Hold ``event`` (for ``put``) if this thread collects; whether it did."""
        if self._owner != threading.get_ident():
            return False
        self._held.append((put, event))
        return True

    def release(self) -> None:
        """Hand on what is held now, in the order it came."""
        held, self._held = self._held, []
        for put, event in held:
            put(event)


class TurnHandle(TurnEnd):
    """The local engine's :class:`~localchat.events.Turn`: PrefillProgress*, Thinking* and
    Token*, then exactly one Done or Failed, emitted by the engine thread.

    Iterating blocks per event. ``stop()`` asks the producer to end
    the turn; a Done with finish_reason "aborted" and the partial reply follows, and nothing
    before it (see ``Turn``).
    """

    def __init__(self, on_stop: Callable[[TurnHandle], None] | None = None) -> None:
        super().__init__()
        self.submitted_at = time.perf_counter()
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._on_stop = on_stop
        self._hold_s = 0.0
        self._shown: threading.Event | None = None  # see hold_first_text
        self._text_emitted = False
        self._outbox: Outbox | None = None  # see deliver_through

    def __iter__(self) -> Iterator[Event]:
        return self._read(iter(self._events.get, None))

    def stop(self) -> None:
        self._stop_reading()
        self._stopped.set()
        if self._on_stop is not None:
            self._on_stop(self)

    @property
    def stop_requested(self) -> bool:
        return self._stopped.is_set()

    def hold_first_text(self, timeout_s: float) -> None:
        """(The consumer, before the reply's first text.) Once the producer has emitted the first
        text, it waits for ``first_text_shown`` (at most ``timeout_s``) before it decodes on.

        On a CPU the next decode takes every core, and the threads that carry the text on (a
        server's: its request thread, then its event loop) wait for the OS to give them one:
        measured in ``serve`` (2 cores), the first token reached the socket 5 ms after it was
        sampled, 1.4 ms with the hold (/infill TTFT 78.5 -> 74.2 ms)."""
        self._hold_s = timeout_s
        self._shown = threading.Event()

    def first_text_shown(self) -> None:
        """(The consumer.) The first text has reached the user: the producer may decode on."""
        if self._shown is not None:
            self._shown.set()

    def deliver_through(self, outbox: Outbox) -> None:
        """(The producer.) Events emitted while ``outbox`` collects on this thread wait there."""
        self._outbox = outbox

    def emit(self, event: Event) -> None:
        """Deliver ``event``; a final one first runs the ``on_finish`` callbacks (this thread)."""
        if isinstance(event, (Done, Failed)):
            event = self._finish(event)
        if self._outbox is None or not self._outbox.take(self._events.put, event):
            self._events.put(event)
        if (self._shown is not None and not self._text_emitted
                and isinstance(event, (Token, Thinking)) and event.text):
            if self._outbox is not None:
                self._outbox.release()  # the text it holds for goes out now, in order
            self._text_emitted = True
            self._shown.wait(self._hold_s)


class TurnClock:
    """Collects the instants that define TTFT, TPOT and inter-token latency for one turn."""

    def __init__(self, submitted_at: float) -> None:
        self.submitted_at = submitted_at
        self.prefill_started: float | None = None
        self.prefill_ended: float | None = None
        self.token_times: list[float] = []
        self.first_text_at: float | None = None
        self.first_answer_at: float | None = None
        self.thinking_n = 0

    def prefill_start(self) -> None:
        self.prefill_started = time.perf_counter()

    def prefill_end(self) -> None:
        self.prefill_ended = time.perf_counter()

    def token(self, has_text: bool, *, thinking: bool = False, answer_text: bool | None = None) -> None:
        """One sampled token. ``thinking``: it belongs to the reasoning; ``answer_text``: it
        released answer text (default: ``has_text``, for replies without reasoning)."""
        now = time.perf_counter()
        self.token_times.append(now)
        if has_text and self.first_text_at is None:
            self.first_text_at = now
        if thinking:
            self.thinking_n += 1
        answered = has_text if answer_text is None else answer_text
        if answered and self.first_answer_at is None:
            self.first_answer_at = now

    def fill(self, timings: Timings) -> Timings:
        def ms(a: float, b: float) -> float:
            return (b - a) * 1000.0

        if self.prefill_started is not None and self.prefill_ended is not None:
            timings.prompt_ms = ms(self.prefill_started, self.prefill_ended)
        times = self.token_times
        timings.predicted_n = len(times)
        if times:
            start = self.prefill_ended or self.submitted_at
            timings.predicted_ms = ms(start, times[-1])
            first = self.first_text_at or times[0]
            timings.ttft_ms = ms(self.submitted_at, first)
        timings.thinking_n = self.thinking_n
        if self.thinking_n == 0:
            timings.time_to_answer_ms = timings.ttft_ms  # no reasoning: the first text is the answer
        elif self.first_answer_at is not None:
            timings.time_to_answer_ms = ms(self.submitted_at, self.first_answer_at)
        gaps = [ms(a, b) for a, b in zip(times, times[1:])]
        if gaps:
            timings.tpot_ms = sum(gaps) / len(gaps)
            timings.itl_p50_ms = percentile(gaps, 50)
            timings.itl_p95_ms = percentile(gaps, 95)
        return timings


class ReplyEvents:
    """Turns each sampled token's text into the turn's events: reasoning as ``Thinking``, the
    answer as ``Token`` (one per sampled token, possibly empty, carrying its id and probability),
    and tells the clock which tokens were reasoning and when the answer began."""

    def __init__(self, handle: TurnHandle, clock: TurnClock, *, inside: bool,
                 calls: ToolCallSplitter | None = None, verbatim: bool = False) -> None:
        """``calls``: the answer goes through it, so that Tokens carry the answer without any
        tool call's marker and JSON, and ``calls`` gathers the calls. ``verbatim``: a
        completion's text (a raw prompt: code, a fill-in-the-middle), every character as the
        model wrote it, at once: no reasoning block is looked for, and the whitespace it starts
        with (a line's indentation) is kept, never held back or dropped."""
        self._handle = handle
        self._clock = clock
        self._splitter = VerbatimSplitter() if verbatim else ReasoningSplitter(inside=inside)
        self._calls = calls
        self._reasoning: list[str] = []

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The tool calls read from the answer so far (all of them after ``finish``)."""
        return tuple(self._calls.calls) if self._calls is not None else ()

    def token(self, text: str, token: int, stats: TokenStats | None,
              logprob: TokenLogprob | None = None) -> None:
        was_thinking = self._splitter.thinking
        thinking, answer = self._splitter.feed(text)
        in_reasoning = was_thinking or self._splitter.thinking
        if self._calls is not None and answer:
            answer = _text_of(self._calls.feed(answer))
        self._clock.token(bool(text), thinking=in_reasoning, answer_text=bool(answer))
        self._emit_thinking(thinking)
        if answer or not in_reasoning:
            if stats is None:
                self._handle.emit(Token(answer, token, logprob=logprob))
            else:
                self._handle.emit(Token(answer, token, stats.prob, stats.margin, stats.entropy,
                                        logprob))

    def finish(self) -> str:
        """Release what the splitter held back; the whole reasoning text."""
        thinking, answer = self._splitter.flush()
        self._emit_thinking(thinking)
        if self._calls is not None:
            answer = _text_of([*self._calls.feed(answer), *self._calls.flush()])
        if answer:
            self._handle.emit(Token(answer))
        return "".join(self._reasoning)

    def _emit_thinking(self, text: str) -> None:
        if text:
            self._reasoning.append(text)
            self._handle.emit(Thinking(text))



class VerbatimSplitter:
    """The splitter of a reply that has no reasoning: all of it is answer, as it comes."""

    thinking = False

    def feed(self, text: str) -> tuple[str, str]:
        return "", text

    def flush(self) -> tuple[str, str]:
        return "", ""


def _text_of(pieces: list[str | ToolCall]) -> str:
    """The answer text among a splitter's pieces (its calls it keeps in ``calls``)."""
    return "".join(piece for piece in pieces if isinstance(piece, str))
