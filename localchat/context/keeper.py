"""ContextKeeper: applies the budget policy (budget.py) to a live ChatContext and engine.

It takes the conversation as a ``ConversationWindow`` (what it reads and moves of a
``ChatContext``), so the ``ChatContext`` that holds a keeper is not imported here.

Before each turn it measures the context from the engine's exact per-message token records,
asks ``plan_turn`` what to drop, and moves the session's window (the engine then removes those
turns from its KV cache by shifting: the one approximation, used by this conversation only).
After each reply it asks ``should_prepare_summary`` and, when told to, has the engine write the
next summary as a background turn on top of the cached conversation (nothing kept in the cache
afterwards, and any user message stops it). A finished summary goes in right after the system
prompt; the engine prefills from there in the background (see ``_install``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from localchat.context.budget import (
    ContextLayout,
    ContextSettings,
    SummaryRequest,
    TurnPlan,
    TurnSpan,
    plan_turn,
    should_prepare_summary,
)
from localchat.context.message import Message
from localchat.context.oversized_message import head_tail_cut, marker_text
from localchat.context.turn_engine import TurnEngine
from localchat.engine.options import Sampling
from localchat.events import Done, Failed, Timings, Turn

if TYPE_CHECKING:
    from localchat.engine.layout import CachedMessage

SUMMARY_INSTRUCTION = (
    "Write a summary of our conversation so far (and of any earlier summary) in at most {words} "
    "words. Keep names, numbers, facts, decisions and open questions. Write only the summary."
)
# The end-of-turn marker of the last reply is not in the cache until the next turn adds it.
END_MARKER_ALLOWANCE = 2


class ContextEngine(TurnEngine, Protocol):
    """What the keeper needs from the engine besides turns: the model's tokenizer and context
    size, exact counts of what its KV cache holds, and background turns (a summary) that any
    turn of the user's stops."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def tokens_in_context(self) -> int: ...

    @property
    def can_trim_in_place(self) -> bool:
        """Whether dropping old turns keeps the later cells (else the kept turns are prefilled
        again)."""
        ...

    def cached_messages(self) -> list[CachedMessage]:
        """What the KV cache holds, one record per message."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def template_overhead(self) -> int:
        """Template tokens a new user message adds around its text, with the reply header."""
        ...

    def prompt_tokens(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> int:
        """The exact length of ``messages`` as the template renders them."""
        ...

    def submit(self, messages: list[dict[str, str]], sampling: Sampling | None = None, *,
               background: bool = False) -> Turn: ...


class ConversationWindow(Protocol):
    """What the keeper reads and moves of a conversation (``ChatContext`` is one): its history,
    the window the model sees of it (the first visible message, the summary and whether the
    summary is shown), and the lock that guards them against a background summary swap."""

    summary: str
    summary_in_context: bool
    first_visible: int

    @property
    def system(self) -> str: ...

    @property
    def history(self) -> Sequence[Message]: ...

    @property
    def state_lock(self) -> AbstractContextManager[Any]: ...

    def model_messages(self) -> list[dict[str, str]]:
        """What the model is shown now: system prompt, summary, the visible turns."""
        ...

    def tools_for_prefill(self) -> tuple[dict[str, Any], ...]: ...


class ContextKeeper:
    def __init__(self, engine: ContextEngine, settings: ContextSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.summary_through = -1  # newest exchange folded into the session's summary
        self.summary_text_tokens = 0  # the summary's own tokens (what summary_max_tokens caps)
        # A summary being written, then installed (set until it is in the context, or dropped).
        self.in_flight: SummaryRequest | None = None
        self.last_plan: TurnPlan | None = None
        self._generation = 0  # bumped by reset(): a summary started before it is discarded
        self._trimmed_in_background = 0
        self._rebuilt_in_background: list[Timings] = []
        # What putting each summary in cost (background prefill), for bench.
        self.install_timings: list[Timings] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        """The conversation was cleared: no summary, nothing pending (a running one is dropped)."""
        with self._lock:
            self.summary_through = -1
            self.summary_text_tokens = 0
            self.in_flight = None
            self.last_plan = None
            self._generation += 1

    # -- before a turn ---------------------------------------------------------------------------

    def make_room(self, session: ConversationWindow, text: str) -> tuple[str, str | None]:
        """Trim the session's window so ``text`` and its reply fit. Returns (text to send, which
        may carry a visible cut marker; a refusal message or None)."""
        overhead = self.engine.template_overhead()
        new_tokens = self.engine.count_tokens(text) + overhead
        # A prepared summary is swapped in by the background (see _install), never here: the
        # user would wait for its prefill. A trim now only drops turns, which costs no prefill.
        layout = self._exact_layout(session, text, new_tokens)
        plan = plan_turn(self.settings, layout, new_tokens, new_overhead_tokens=overhead,
                         marker_tokens=self._marker_tokens(new_tokens))
        if not plan.fits:
            decision = plan.overlong
            if decision is None or decision.action == "refuse":
                return text, decision.message if decision else "the message does not fit"
            text = self._cut(text, decision.keep_head, decision.keep_tail, decision.cut_tokens)
            plan = plan_turn(self.settings, layout, self.engine.count_tokens(text) + overhead,
                             new_overhead_tokens=overhead)
            if not plan.fits:
                return text, decision.message
        self._apply(session, plan)
        self.last_plan = plan
        return text, None

    def _apply(self, session: ConversationWindow, plan: TurnPlan) -> None:
        if plan.drop:
            session.first_visible = _position_of_exchange(session, plan.drop.stop)
        if plan.summary_action == "remove":
            session.summary_in_context = False

    def _marker_tokens(self, message_tokens: int) -> int:
        return self.engine.count_tokens(marker_text(self.settings, message_tokens))

    def _cut(self, text: str, keep_head: int, keep_tail: int, cut: int) -> str:
        ids = self.engine.tokenize(text)
        marker = self.engine.tokenize(marker_text(self.settings, cut))
        return self.engine.detokenize(head_tail_cut(ids, keep_head, keep_tail, marker))

    # -- measuring -------------------------------------------------------------------------------

    def _exact_layout(self, session: ConversationWindow, text: str, new_tokens: int) -> ContextLayout:
        """The layout, corrected to the exact prompt length when the KV records cannot give it
        (first turn, after a restore): per-message estimates miss what a template adds on its
        own, such as a default system prompt when none is set."""
        layout, measured, window = self._measure(session)
        if window and measured:
            return layout
        exact = self.engine.prompt_tokens(window + [{"role": "user", "content": text}])
        estimate = (layout.system_tokens + layout.summary_tokens
                    + sum(t.tokens for t in layout.turns) + new_tokens)
        if exact <= estimate:
            return layout
        return replace(layout, system_tokens=layout.system_tokens + exact - estimate)

    def layout(self, session: ConversationWindow) -> ContextLayout:
        """The context as the policy sees it: exact token counts from the engine's KV records
        when they match the session's window, estimates otherwise (e.g. right after a restore)."""
        return self._measure(session)[0]

    def _measure(self, session: ConversationWindow) -> tuple[ContextLayout, bool, list[dict[str, str]]]:
        """(layout, whether its counts came from the KV records, the window it measured)."""
        messages = session.model_messages()
        records = self.engine.cached_messages()
        exact = _records_match(records, messages)
        sizes = ([len(r.tokens) for r in records[:len(messages)]] if exact else
                 [self.engine.count_tokens(m["content"]) + self.engine.template_overhead()
                  for m in messages])
        pinned = (1 if session.system else 0)
        system_tokens = sum(sizes[:pinned])
        summary_tokens = 0
        if session.summary and session.summary_in_context:
            summary_tokens = sum(sizes[pinned:pinned + 2])
            pinned += 2
        turns: list[TurnSpan] = []
        exchange = _exchange_of_position(session, session.first_visible)
        for message, size in zip(messages[pinned:], sizes[pinned:]):
            if message["role"] == "user" or not turns:
                turns.append(TurnSpan(exchange + len(turns), size))
            else:
                last = turns[-1]
                turns[-1] = TurnSpan(last.index, last.tokens + size)
        if turns:
            last = turns[-1]
            turns[-1] = TurnSpan(last.index, last.tokens + END_MARKER_ALLOWANCE)
        through = min(self.summary_through, turns[0].index - 1) if turns else self.summary_through
        return ContextLayout(system_tokens, summary_tokens, through, tuple(turns)), exact, messages

    # -- after a turn ----------------------------------------------------------------------------

    def after_reply(self, session: ConversationWindow) -> None:
        """After a reply: start writing the next summary if one is due (it is swapped in as
        soon as it is written, see ``_install``)."""
        with self._lock:
            in_flight = self.in_flight
        if not self.engine.can_trim_in_place:
            self._trim_ahead(session)
        request = should_prepare_summary(self.settings, self.layout(session), in_flight=in_flight)
        if request is None:
            return
        with self._lock:
            self.in_flight = request
            generation = self._generation
        instruction = SUMMARY_INSTRUCTION.format(words=max(20, int(request.max_tokens * 0.7)))
        messages = session.model_messages() + [{"role": "user", "content": instruction}]
        sampling = Sampling(temperature=0.2, max_tokens=request.max_tokens, repeat_penalty=1.1)
        handle = self.engine.submit(messages, sampling, background=True)
        handle.on_finish(lambda event: self._summary_finished(session, request, event, generation))

    def _summary_finished(self, session: ConversationWindow, request: SummaryRequest,
                          event: Done | Failed, generation: int) -> None:
        text = event.answer.strip() if isinstance(event, Done) and event.finish_reason != "aborted" else ""
        if text:
            ids = self.engine.tokenize(text)[: self.settings.summary_max_tokens]
            text = self.engine.detokenize(ids).strip()
        with self._lock:
            if generation != self._generation:
                return
            if not text:
                self.in_flight = None
                return
        self._install(session, request.through, text, self.engine.count_tokens(text), generation)

    def _install(self, session: ConversationWindow, through: int, text: str, tokens: int,
                 generation: int) -> None:
        """Swap the prepared summary in: the window drops the turns it covers and shows the
        summary after the system prompt. Nothing is inserted before cached cells (they would not
        be what the model computes for that history), so the engine prefills from the summary on,
        in the background and at once; a user message stops that and reuses what it prefilled."""
        with session.state_lock, self._lock:
            if generation != self._generation:  # the conversation was cleared meanwhile
                return
            layout = self.layout(session)
            self._trimmed_in_background += layout.summary_tokens + sum(
                turn.tokens for turn in layout.turns if turn.index <= through)
            session.summary, session.summary_in_context = text, True
            session.first_visible = max(session.first_visible,
                                        _position_of_exchange(session, through + 1))
            self.summary_through = through
            self.summary_text_tokens = min(tokens, self.settings.summary_max_tokens)
            self.in_flight = None
            messages = session.model_messages()
            tools = session.tools_for_prefill()
        self.engine.prepare(messages, tools).on_finish(self._installed)

    def _trim_ahead(self, session: ConversationWindow) -> None:
        """For a model whose memory cannot drop turns (recurrent, hybrid), a trim means
        prefilling the kept turns again. Do it now, in the background, when the next message
        of the usual size would not fit, so that message does not wait for it."""
        overhead = self.engine.template_overhead()
        recent = [m for m in session.history[session.first_visible:] if m.role == "user"][-3:]
        expected = max([self.engine.count_tokens(m.content) for m in recent] + [32]) + overhead
        with session.state_lock:
            layout = self.layout(session)
            if layout.used_tokens + expected <= self.settings.prompt_capacity:
                return
            plan = plan_turn(self.settings, layout, expected, new_overhead_tokens=overhead)
            if not plan.fits or not plan.drop:
                return
            self._apply(session, plan)
            with self._lock:
                self._trimmed_in_background += plan.dropped_tokens
            messages = session.model_messages()
            tools = session.tools_for_prefill()
        self.engine.prepare(messages, tools).on_finish(self._rebuilt)

    def _rebuilt(self, event: Done | Failed) -> None:
        if isinstance(event, Done) and event.timings.rebuild_n:
            with self._lock:
                self._rebuilt_in_background.append(event.timings)

    def take_rebuilt_in_background(self) -> tuple[int, float]:
        """(tokens, ms) prefilled again in the background since the last call (for the next
        turn's timings): the kept turns after a trim on a memory that cannot drop them, or
        behind a summary that went in before them."""
        with self._lock:
            done, self._rebuilt_in_background = self._rebuilt_in_background, []
        return sum(t.rebuild_n for t in done), sum(t.prompt_ms for t in done)

    def _installed(self, event: Done | Failed) -> None:
        if isinstance(event, Done) and event.finish_reason == "stop":
            with self._lock:
                self.install_timings.append(event.timings)
        self._rebuilt(event)

    def take_trimmed_in_background(self) -> int:
        """Tokens removed by summary swaps since the last call (reported with the next turn)."""
        with self._lock:
            moved, self._trimmed_in_background = self._trimmed_in_background, 0
        return moved


def _records_match(records: list, messages: list[dict[str, str]]) -> bool:
    """The engine's KV records cover ``messages`` (so their token counts are exact)."""
    return len(records) >= len(messages) and all(r.matches(m) for r, m in zip(records, messages))


def _position_of_exchange(session: ConversationWindow, exchange: int) -> int:
    """History index of the ``exchange``-th user message (len(history) when there is none)."""
    seen = -1
    for position, message in enumerate(session.history):
        if message.role == "user":
            seen += 1
            if seen == exchange:
                return position
    return len(session.history)


def _exchange_of_position(session: ConversationWindow, position: int) -> int:
    return sum(1 for m in session.history[:position] if m.role == "user")
