"""A scripted tool round for ``FakeEngine``: the events the chat layer's tool loop emits, for
fast UI tests of tool calls (the loop itself is tested in the chat layer's tests).

``FakeEngine(reply=..., tools=ToolRound(...))`` streams its reply, then plays the round the way
the loop does (``localchat.tools``'s wiring plan): per call ``ToolCalled``; a call with a
``problem`` gets its error result at once; else the ``policy`` decides, and when it asks,
``ToolApproval`` carries the real ``ApprovalRequest`` and the round waits on its future (a stop
denies); a denied call never runs; a call that runs returns ``results[name]`` (text, or an
exception's message as an error result) or, with ``hold_call``, runs until the turn is stopped
(Esc cancels it). Then the model's next reply (``then``) streams and the turn ends.

``round_done=True`` also ends the first reply with its own ``Done(tool_calls=...)`` before the
round, as a producer that reports each reply's end may; ``RoundsTurnHandle`` delivers that Done
without ending the turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from localchat.engine.turn import TurnHandle
from localchat.events import Done, Event, Failed, ToolApproval, ToolCalled, ToolReturned
from localchat.reply.calls import ToolCall, ToolResult, failed_call_result
from localchat.tools.approval import ApprovalPolicy, Decision
from localchat.tools.catalogue import ToolInfo
from localchat.tools.results import cancelled_result, denied_result, error_result, make_result

ANSWER_POLL_S = 0.01


def tool(name: str, server: str = "files", description: str = "") -> ToolInfo:
    return ToolInfo(server, name, description, {"type": "object", "properties": {}}, name)


@dataclass
class ToolRound:
    calls: list[tuple[ToolCall, ToolInfo]]
    then: str = "Done with the tools."
    results: dict[str, str | Exception] = field(default_factory=dict)
    policy: ApprovalPolicy | None = None  # None: every call runs without asking
    hold_call: bool = False
    round_done: bool = False
    # What happened, for tests: (call id, decision or "ran"/"cancelled"/"problem").
    log: list[tuple[str, str]] = field(default_factory=list)
    running: threading.Event = field(default_factory=threading.Event)  # a held call runs

    def play(self, emit: Callable[[Event], None], stop: threading.Event) -> bool:
        """Emit the round's events; False when the turn was stopped during it."""
        for call, info in self.calls:
            emit(ToolCalled(call, info.label))
            started = time.perf_counter()
            if not call.runnable:
                self.log.append((call.id, "problem"))
                emit(ToolReturned(call, failed_call_result(call)))
                continue
            request = self.policy.check(call, info) if self.policy is not None else None
            if request is not None:
                emit(ToolApproval(call, request))
                while not request.future.done():
                    if stop.wait(ANSWER_POLL_S):
                        request.answer(Decision.DENY)
                decision = request.future.result()
                self.log.append((call.id, decision.value))
                if not decision.allows:
                    emit(ToolReturned(call, denied_result(call, info.label)))
                    if stop.is_set():
                        return False
                    continue
            result = self._run(call, info, stop)
            emit(ToolReturned(call, result, (time.perf_counter() - started) * 1000))
            if stop.is_set():
                return False
        return True

    def _run(self, call: ToolCall, info: ToolInfo, stop: threading.Event) -> ToolResult:
        if self.hold_call:
            self.running.set()
            stop.wait()
            self.running.clear()
            self.log.append((call.id, "cancelled"))
            return cancelled_result(call, info.label)
        self.log.append((call.id, "ran"))
        outcome = self.results.get(info.name, "ok")
        if isinstance(outcome, Exception):
            return error_result(call, info.label, str(outcome))
        return make_result(call, info.label, outcome, False, 20_000)


class RoundsTurnHandle(TurnHandle):
    """A TurnHandle that can also deliver a reply's ``Done`` in the middle of the turn
    (``end_round``): the turn goes on after it."""

    def __init__(self, on_stop: Callable[[TurnHandle], None] | None = None) -> None:
        super().__init__(on_stop)
        self._round_ends: set[int] = set()

    def end_round(self, done: Done) -> None:
        self._round_ends.add(id(done))
        self._events.put(done)

    def _read(self, events: Iterable[Event]) -> Iterator[Event]:
        for event in events:
            if isinstance(event, Done) and id(event) in self._round_ends:
                if not self._stop_seen.is_set():
                    yield event
                continue
            if isinstance(event, (Done, Failed)):
                yield event
                return
            if not self._stop_seen.is_set():
                yield event
