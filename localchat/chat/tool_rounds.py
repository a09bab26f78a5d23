"""Tool rounds: one turn in which the model may call tools, each call approved before it runs.

:func:`start` sends a user message with the tools of ``chat.tools.ChatTools`` and returns a
:class:`ToolTurn`, a ``localchat.events.Turn`` whose events are, in one stream:

- the reply's events (``Token``, ``Thinking``, ``Notice``...), its own ``Done`` held back;
- when that ``Done`` has ``tool_calls`` (and was not stopped), per call in order: the call is
  looked up once (``ToolRegistry.resolve``: a call that cannot run or names no tool gets its
  error result without asking); ``ToolCalled``; ``ToolApproval`` when the user must decide (the
  round waits on the question's future; a denial gives the model "denied by the user"); the
  resolved call runs (``ToolRegistry.call``, ``[tools] timeout_s``); ``ToolReturned``.
  The history gains the reply (an assistant message with ``tool_calls``) and one ``tool`` message
  per result, and the next reply starts at once (``ChatContext.resume``): the engine prefills only
  the results and the next header;
- ... until a reply calls nothing: its ``Done`` is the turn's final event. ``Failed`` ends it too.
  A ``tool_choice`` of "required" or a tool's name holds for the first reply; the ones after a
  round are "auto" (the model has its results and may answer).

Limits, each shown as a ``Notice`` when hit: ``[tools] max_rounds`` rounds per turn (the calls of
the reply past it do not run: each gets an error result saying so, and the model answers once
more with what it has; should that reply call again, its calls are dropped), ``timeout_s`` per
call, results capped (``result_chars``, sized to the context), at most ``MAX_CALLS_PER_REPLY``
calls run per reply (the others get an error result).

``stop()`` (Esc) stops the reply being written, cancels a call that is running (within 50 ms)
and denies a question not yet answered. A turn stopped during its calls ends with the reply that
called, marked stopped and kept as the text it is, without its calls (the results of calls that
had finished are not kept): the history then ends with a plain stopped reply, as any stopped turn.

``rounds`` lists what the turn added to the history before its final reply (for the store:
``Conversation`` writes them with the reply). Events are produced on the reader's thread: the
call starts as soon as the reply's ``Done`` is read, the next reply as soon as the last result
is in (``marks`` holds those instants, for ``bench --tools``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from localchat.context.chat_context import ChatContext, TurnRouter
from localchat.context.message import Message
from localchat.events import (
    Decision,
    Done,
    Event,
    Failed,
    Final,
    Notice,
    ToolApproval,
    ToolCalled,
    ToolReturned,
    Turn,
    TurnEnd,
)
from localchat.reply.calls import ToolCall, ToolResult
from localchat.tools.approval import ApprovalRequest
from localchat.tools.registry import ResolvedCall
from localchat.tools.results import denied_result

if TYPE_CHECKING:
    from localchat.chat.tools import ChatTools
    from localchat.engine.options import Sampling

log = logging.getLogger("localchat.chat.tools")

MAX_CALLS_PER_REPLY = 16  # more in one reply each get an error result (a remote may send any)


@dataclass(frozen=True)
class RoundMessage:
    """One message a tool round added to the history, with what the store keeps beside it."""

    message: Message
    done: Done | None = None  # an assistant reply that called: its Done (timings, route)
    result: ToolResult | None = None  # a tool message: its result (is_error, notice)
    label: str = ""  # a tool message: server.tool, as the user saw it
    elapsed_ms: float = 0.0


def start(chat: ChatContext, text: str, tools: ChatTools, sampling: Sampling | None = None, *,
          tool_choice: str = "auto", router: TurnRouter | None = None,
          images: tuple[bytes, ...] = ()) -> Turn:
    """Send ``text`` (and ``images``, its pictures) with the tools that can be called now. A
    turn with no tools to offer is a plain one (``ChatContext.send``'s). ``UserError`` for a
    ``tool_choice`` no tool can meet."""
    offered = tools.offer(sampling or chat.sampling, tool_choice)
    first = chat.send(text, offered, router=router, images=images)
    if not offered.tools or first.finished and isinstance(first.result, Failed):
        return first
    return ToolTurn(chat, tools, offered, first, router)


class ToolTurn(TurnEnd):
    """One turn with its tool rounds (see the module)."""

    def __init__(self, chat: ChatContext, tools: ChatTools, sampling: Sampling, first: Turn,
                 router: TurnRouter | None = None) -> None:
        super().__init__()
        self.chat = chat
        self.tools = tools
        self.sampling = sampling
        self.router = router
        self.rounds: list[RoundMessage] = []
        # perf_counter instants: "reply_end" (a reply's calls read), "tool_start", "tool_end",
        # "resume" (the next reply submitted).
        self.marks: dict[str, list[float]] = {}
        self._current: Turn = first
        self._request: ApprovalRequest | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<ToolTurn rounds={len(self.rounds)} finished={self.finished}>"

    def __iter__(self) -> Iterator[Event]:
        return self._read(self._events())

    def stop(self) -> None:
        self._stop_reading()
        self._stopped.set()  # a running call polls it
        with self._lock:
            current, request = self._current, self._request
        current.stop()
        if request is not None:
            request.answer(Decision.DENY)

    def _mark(self, name: str) -> None:
        self.marks.setdefault(name, []).append(time.perf_counter())

    # -- the loop ------------------------------------------------------------------------------

    def _events(self) -> Iterator[Event]:
        try:
            yield from self._loop()
        except Exception as exc:  # a bug of ours: the turn fails with a line, never a traceback
            log.exception("the tool rounds failed")
            yield self._finish(Failed(f"the tool loop failed ({type(exc).__name__}: {exc})"))

    def _loop(self) -> Iterator[Event]:
        max_rounds = self.tools.settings.max_rounds
        rounds = 0
        while True:
            final = yield from self._reply(self._current)
            if isinstance(final, Failed) or not final.tool_calls \
                    or final.finish_reason == "aborted" or self._stopped.is_set():
                yield self._finish(final)
                return
            self._mark("reply_end")
            if rounds > max_rounds:  # the reply after the limit called again: not run
                yield Notice(f"the reply still asked for tools after the limit of {max_rounds} "
                             "rounds; those calls were not run", kind="tool_limit")
                yield self._finish(self._without_calls(final, stopped=False))
                return
            rounds += 1
            self.rounds.append(RoundMessage(self.chat.history[-1], done=final))
            if rounds > max_rounds:
                yield Notice(f"tool rounds per reply: the limit of {max_rounds} was reached; "
                             "the model answers with what it has", kind="tool_limit")
                results = [(self._over_limit(call, max_rounds), 0.0, self.tools.registry.label(call))
                           for call in final.tool_calls]
                for call, (result, _, _) in zip(final.tool_calls, results):
                    yield ToolReturned(call, result)
            else:
                results = []
                for index, call in enumerate(final.tool_calls):
                    if index >= MAX_CALLS_PER_REPLY:  # a remote may send any number
                        result = self._too_many(call)
                        yield ToolCalled(call, self.tools.registry.label(call))
                        yield ToolReturned(call, result)
                        results.append((result, 0.0, self.tools.registry.label(call)))
                        continue
                    outcome = yield from self._run(call)
                    results.append(outcome)
            if self._stopped.is_set():
                self.rounds.pop()
                yield self._finish(self._without_calls(final, stopped=True))
                return
            self.chat.add_results([result for result, _, _ in results])
            for (result, elapsed, label), message in zip(results, self.chat.history[-len(results):]):
                self.rounds.append(RoundMessage(message, result=result, label=label,
                                                elapsed_ms=elapsed))
            self._mark("resume")
            # "required" or a tool's name asked for a call, which came: the model may now answer
            # (the tools render the same whatever the choice, so the cache still holds).
            self._begin(partial(self.chat.resume, replace(self.sampling, tool_choice="auto"),
                                router=self.router))

    def _begin(self, start: Callable[[], Turn]) -> None:
        handle = start()
        with self._lock:
            self._current = handle
        if self._stopped.is_set():
            handle.stop()  # stop() came while this reply was being started

    @staticmethod
    def _reply(turn: Turn) -> Generator[Event, None, Final]:
        final: Final | None = None
        for event in turn:
            if isinstance(event, (Done, Failed)):
                final = event
                break
            yield event
        if final is None:
            final = turn.result or Failed("the reply ended without a final event")
        return final

    def _run(self, call: ToolCall) -> Generator[Event, None, tuple[ToolResult, float, str]]:
        """One call: looked up, shown, approved, run; yields its events and returns (result,
        ms, label)."""
        resolved = self.tools.registry.resolve(call, self.tools.settings.start_timeout_s)
        yield ToolCalled(call, resolved.label)
        started = time.perf_counter()
        if resolved.failure is not None:
            result = resolved.failure
        else:
            result = yield from self._approved_run(resolved)
        elapsed = (time.perf_counter() - started) * 1000.0
        yield ToolReturned(call, result, elapsed)
        return result, elapsed, resolved.label

    def _approved_run(self, resolved: ResolvedCall) -> Generator[Event, None, ToolResult]:
        call, tool = resolved.call, resolved.tool
        assert tool is not None  # resolved without a failure
        request = self.tools.policy.check(call, tool)
        if request is not None:
            with self._lock:
                self._request = request
            if self._stopped.is_set():
                request.answer(Decision.DENY)
            yield ToolApproval(call, request)
            decision = request.wait()
            with self._lock:
                self._request = None
            if not decision.allows:
                return denied_result(call, resolved.label)
        self._mark("tool_start")
        n_ctx = getattr(self.chat.engine, "n_ctx", None)
        result = self.tools.registry.call(
            resolved, cancel=self._stopped,
            max_chars=self.tools.settings.result_chars(n_ctx if isinstance(n_ctx, int) else None))
        self._mark("tool_end")
        return result

    def _over_limit(self, call: ToolCall, max_rounds: int) -> ToolResult:
        return ToolResult(call.id, call.name, f"error: not run: the limit of {max_rounds} tool "
                          "rounds per reply was reached; answer with what you have",
                          is_error=True, notice="")

    @staticmethod
    def _too_many(call: ToolCall) -> ToolResult:
        return ToolResult(call.id, call.name, f"error: not run: a reply may call at most "
                          f"{MAX_CALLS_PER_REPLY} tools at once", is_error=True,
                          notice=f"{call.name}: not run (over {MAX_CALLS_PER_REPLY} calls in "
                          "one reply)")

    def _without_calls(self, final: Done, *, stopped: bool) -> Done:
        """``final`` as a reply whose calls do not run: its history message keeps the text as
        the model wrote it, without ``tool_calls``."""
        with self.chat.state_lock:
            last = self.chat.history[-1] if self.chat.history else None
            if last is not None and last.role == "assistant" and last.content == final.reply:
                self.chat.history[-1] = replace(last, tool_calls=(), stopped=stopped or last.stopped)
        return replace(final, tool_calls=(), finish_reason="aborted" if stopped
                       else final.finish_reason)

