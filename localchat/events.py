"""The one event vocabulary that the local engine and the remote client emit, and that the TUI,
``ask`` and ``bench`` consume.

A turn produces, in order: zero or more ``PrefillProgress``, zero or more ``Thinking`` (a reasoning
model's chain of thought) and ``Token`` (the answer), and exactly one final ``Done`` (finish_reason
"stop", "length" or "aborted") or ``Failed``. ``Notice`` may appear anywhere; ``RouteChanged``
where the reply changes hands between the local and the remote model.

A reply that calls tools ends with a ``Done`` whose ``tool_calls`` are the calls it asked for
(their markers and JSON never streamed as ``Token`` text). The chat's tool rounds then emit, per
call, ``ToolCalled``, ``ToolApproval`` when the user must decide (the front end answers the
request it carries), and ``ToolReturned`` with the result; the model's next reply follows, as
events of the same turn, until a reply calls nothing or a limit is hit. Model loading produces
``LoadProgress`` then ``Loaded`` or ``Failed``.

The question a ``ToolApproval`` carries is typed here, as what a front end may rely on: an
:class:`ApprovalQuestion` about an :class:`ApprovedTool`, answered with a :class:`Decision`
(``localchat.tools.approval`` makes them and keeps the user's grants).

Every producer of a turn (the local engine's ``TurnHandle``, the remote client's ``RemoteTurn``,
the escalator's ``EscalatedTurn``) hands it out as one :class:`Turn`; :class:`TurnEnd` is the
bookkeeping of its final event that they share.

Timing field names follow llama.cpp's server (``cache_n``, ``prompt_n``, ``prompt_ms``,
``predicted_n``, ``predicted_ms``) so numbers can be compared with it directly.
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol

from localchat.reply.calls import ToolCall, ToolResult
from localchat.reply.reasoning import split_reply

FinishReason = Literal["stop", "length", "aborted"]


@dataclass
class Timings:
    """What one turn cost. Times in milliseconds."""

    cache_n: int = 0  # tokens reused from the KV cache
    prompt_n: int = 0  # tokens prefilled this turn
    prompt_ms: float = 0.0
    predicted_n: int = 0  # tokens generated
    predicted_ms: float = 0.0
    ttft_ms: float = 0.0  # turn submitted -> first token text available (reasoning or answer)
    time_to_answer_ms: float = 0.0  # turn submitted -> first answer text (0: no answer came)
    thinking_n: int = 0  # of predicted_n, tokens spent reasoning (remote: reasoning chunks)
    tpot_ms: float = 0.0  # mean decode time per token after the first
    # Inter-token latency: percentiles (localchat.percentiles) of the gaps between consecutive
    # reply tokens as they arrive (remote: streamed chunks, one token each), on either route.
    itl_p50_ms: float = 0.0
    itl_p95_ms: float = 0.0
    n_ctx: int = 0
    n_ctx_used: int = 0  # tokens in the KV cache when the turn ended
    # The chat template rewrote earlier turns, so reuse fell back to the longest common prefix.
    prefix_fallback: bool = False
    # Context management (issue: context that never overflows).
    trimmed_n: int = 0  # tokens removed from the KV cache this turn
    summary_n: int = 0  # tokens of running summary in context
    context_shift: bool = False  # trimmed by shifting KV positions (no re-prefill)
    # Cells in use that a context shift made approximate (they serve this conversation only).
    approx_n: int = 0
    restore_ms: float = 0.0  # time to restore a saved KV snapshot before this turn
    # Pictures the projector encoded this turn (those already cached cost nothing) and the time
    # that took, encode and decode of their embeddings (part of prompt_ms's wall time).
    images_n: int = 0
    image_ms: float = 0.0
    # Prompt tokens evaluated again although the cache held them (a checkpoint rollback, a trim
    # on a memory that cannot drop turns, a changed system prompt or summary before them) ...
    rebuild_n: int = 0
    # ... and what such rebuilding cost in the background since the previous turn.
    rebuild_background_n: int = 0
    rebuild_background_ms: float = 0.0
    # Speculative decoding (llama.cpp server's names): tokens drafted, and those of them the
    # model sampled too (kept without a decode of their own).
    draft_n: int = 0
    draft_n_accepted: int = 0
    # Constrained sampling (a JSON Schema, a grammar): tokens the grammar judged, those of them
    # drawn again because it rejected the first draw, and the redraws that had to check the
    # whole vocabulary (engine/sampling/constrained.py).
    constrained_n: int = 0
    redrawn_n: int = 0
    vocab_passes: int = 0
    route: str = "local"  # "local" or "remote"
    route_reason: str = ""
    fell_back: bool = False  # the remote was asked and failed: this local reply stands
    model: str = ""

    @property
    def rebuild(self) -> bool:
        return self.rebuild_n > 0 or self.rebuild_background_n > 0

    @property
    def draft_acceptance(self) -> float | None:
        """The share of drafted tokens accepted (None when nothing was drafted)."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def predicted_per_second(self) -> float:
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    @property
    def prompt_per_second(self) -> float:
        return 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["predicted_per_second"] = round(self.predicted_per_second, 2)
        d["prompt_per_second"] = round(self.prompt_per_second, 2)
        d["rebuild"] = self.rebuild
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3)
        return d


@dataclass(frozen=True)
class LoadProgress:
    fraction: float  # 0.0 .. 1.0


@dataclass(frozen=True)
class Loaded:
    model: str
    n_ctx: int
    gpu_layers: int  # layers offloaded
    n_layers: int
    backend: str  # "CPU", "CUDA", "Metal", ...
    load_ms: float = 0.0
    memory: str = "kv"  # kv | swa | recurrent | hybrid (engine/runtime.memory_kind)
    speculative: str = "off"  # what drafts tokens ("ngram + draft NAME"), or "off: why"


@dataclass(frozen=True)
class PrefillProgress:
    done: int  # prompt tokens evaluated so far this turn
    total: int  # prompt tokens to evaluate this turn


@dataclass(frozen=True)
class Token:
    text: str  # may be "" when a token ends inside a multi-byte character
    token_id: int = -1
    # Only when confidence tracking is on, and only for the reply's first
    # EngineOptions.confidence_tokens tokens: the probability the model gave the sampled token,
    # the top-1 minus top-2 probability, and the entropy (nats) of the next-token distribution.
    prob: float | None = None
    margin: float | None = None
    entropy: float | None = None
    # Only when the turn asks (``Sampling.logprobs``): the token's log probability and the
    # likeliest tokens at its step (OpenAI's ``logprobs``).
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log probability (natural log, softmax over the whole vocabulary of the
    logits it was drawn from, repeat penalty applied) and the ``Sampling.logprobs`` likeliest
    tokens at that step with theirs, best first; tokens as their bytes."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class Thinking:
    """Reasoning text, streamed before the answer; never part of the answer's Tokens."""

    text: str


@dataclass(frozen=True)
class Done:
    reply: str  # as the model wrote it, reasoning included: what the history keeps
    finish_reason: FinishReason
    timings: Timings = field(default_factory=Timings)
    thinking: str = ""  # the reasoning part of ``reply``, as streamed in Thinking events
    # The tool calls the reply asked for, in order (``ToolCall.raw`` is each as written, markers
    # included, and is part of ``reply``; ``answer`` is the text without them).
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def answer(self) -> str:
        """The reply without its reasoning and its tool calls (as the Tokens showed it)."""
        answer = self.reply
        if self.thinking:
            reasoning, answer = split_reply(self.reply)
            # No closing tag: the reply stopped while still reasoning inside a block the prompt
            # opened.
            answer = answer if reasoning else ""
        if self.tool_calls:
            for call in self.tool_calls:
                answer = answer.replace(call.raw, "\n", 1) if call.raw else answer
            answer = answer.strip()
        return answer


@dataclass(frozen=True)
class Failed:
    message: str  # one line, written for the user
    # What kind of failure, for a front end that answers in a protocol's terms ("" when none):
    # "context_length_exceeded" (errors.ContextOverflow), "conversation_rejected"
    # (errors.ConversationRejected: the chat template refused the messages).
    code: str = ""


@dataclass(frozen=True)
class Notice:
    message: str  # one line, written for the user (a fall-back, a trim, a breaker state)
    kind: str = "info"


@dataclass(frozen=True)
class RouteChanged:
    """The reply changed hands in the middle of a turn (``localchat.remote.escalate``).

    ``route`` "remote": the turn was escalated; the tokens that follow are the remote model's
    and the local text shown so far is not the answer (superseded). ``route`` "local": the
    remote failed; its text shown since the escalation is void and the local reply stands (the
    one kept, or one generated now). ``message``: one line for the user, saying why.
    """

    route: Literal["local", "remote"]
    message: str


@dataclass(frozen=True)
class ToolCalled:
    """The model asked for ``call``; ``label`` is how the user sees it (``server.tool``). A call
    with a ``problem`` never runs: its ``ToolReturned`` (an error result) follows at once."""

    call: ToolCall
    label: str


class Decision(enum.Enum):
    """The user's answer to "may this call run?": this call only, always for this session (for
    ``run_command``: this exact command), always and saved in config.toml, or not at all."""

    ONCE = "once"
    SESSION = "session"
    SAVE = "save"
    DENY = "deny"

    @property
    def allows(self) -> bool:
        return self is not Decision.DENY


class ApprovedTool(Protocol):
    """The tool a question is about, as the user is shown it."""

    @property
    def server(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def label(self) -> str:
        """``server.tool``."""
        ...


class ApprovalQuestion(Protocol):
    """May ``call`` of ``tool`` run? A front end shows ``line`` (or the call and the tool), says
    what "always" covers (``per_command``: only this exact command; ``can_save``: whether it
    may be saved), and calls :meth:`answer` from any thread; ``future`` resolves to the
    :class:`Decision`, whoever settled it (a stopped turn denies)."""

    call: ToolCall
    can_save: bool
    per_command: bool
    line: str
    future: concurrent.futures.Future[Decision]

    @property
    def tool(self) -> ApprovedTool: ...

    def answer(self, decision: Decision) -> str:
        """Settle the question (a second answer is ignored); a notice for the user ("" when
        there is nothing to say)."""
        ...


@dataclass(frozen=True)
class ToolApproval:
    """The user must decide whether ``call`` runs: ``request`` is the question to answer (from
    any thread); the tool rounds wait on it."""

    call: ToolCall
    request: ApprovalQuestion


@dataclass(frozen=True)
class ToolReturned:
    """``call`` ended (ran, failed, was denied or cancelled): ``result`` goes back to the model
    as a ``tool`` message, and ``result.notice`` (when not empty) is a line for the user."""

    call: ToolCall
    result: ToolResult
    elapsed_ms: float = 0.0


Event = (LoadProgress | Loaded | PrefillProgress | Thinking | Token | Done | Failed | Notice
         | RouteChanged | ToolCalled | ToolApproval | ToolReturned)


Final = Done | Failed
FinishCallback = Callable[[Final], None]


class Turn(Protocol):
    """One turn's events, whoever produces them.

    - Iterate once: the events above, ending with exactly one ``Done`` or ``Failed``; each step
      blocks until the next event.
    - ``stop()`` may be called from any thread, any number of times: the turn ends soon with
      ``Done(finish_reason="aborted")`` holding the reply so far. Once ``stop()`` has returned,
      the next event the reader gets is the final one: no ``Token``, ``Thinking`` or ``Notice``
      that was still on its way. The final event still holds everything the producer made: a
      stopped ``Done.reply`` (and ``thinking``) may go on past the text the reader was given, so
      whoever shows the reply shows ``Done`` in the end (the text read is always its start).
      Unless the turn had already ended, the final event is that aborted ``Done``.
    - ``on_finish(callback)``: ``callback(final)`` runs once, on the thread that ends the turn,
      before the final event reaches the reader, so whoever reads ``Done`` already sees its
      effects (the reply in the history); at once if the turn has already ended.
    - ``finished`` is true from that moment on, and ``result`` is the final event.
    """

    @property
    def result(self) -> Final | None: ...

    @property
    def finished(self) -> bool: ...

    def __iter__(self) -> Iterator[Event]: ...

    def stop(self) -> None: ...

    def on_finish(self, callback: FinishCallback) -> None: ...


class TurnEnd:
    """The end of one turn, for classes implementing :class:`Turn`: the final event, set once,
    and the ``on_finish`` callbacks that run before anyone reads it."""

    def __init__(self) -> None:
        self._end_lock = threading.Lock()
        self._callbacks: list[FinishCallback] = []
        self._ended = threading.Event()
        self._result: Final | None = None
        self._stop_seen = threading.Event()

    @property
    def result(self) -> Final | None:
        return self._result

    @property
    def finished(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> Final | None:
        """Block until the turn has ended (without consuming events); the final event."""
        self._ended.wait(timeout)
        return self._result

    def on_finish(self, callback: FinishCallback) -> None:
        with self._end_lock:
            if self._result is None:
                self._callbacks.append(callback)
                return
            final = self._result
        callback(final)  # the turn ended before anyone asked

    def _stop_reading(self) -> None:
        """Called by ``stop()`` before it returns: from now on the reader gets the final event only."""
        self._stop_seen.set()

    def _read(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events`` (the producer's, in order) as the reader gets them: up to the final one, and
        after ``stop()`` nothing but it. The one place the stop contract is kept, for every kind of
        turn: a producer's queue may hold events made just before it saw the stop."""
        for event in events:
            if isinstance(event, (Done, Failed)):
                yield event
                return
            if not self._stop_seen.is_set():
                yield event

    def _finish(self, event: Final) -> Final:
        """Make ``event`` the turn's final event (unless one already is) and run the callbacks;
        the final event, which the caller then delivers to the reader."""
        with self._end_lock:
            if self._result is not None:
                return self._result
            self._result = event
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(event)
        # Ended before the reader can see the final event: a caller that read Done may start
        # the next turn at once (ChatContext.send checks ``finished``).
        self._ended.set()
        return event
