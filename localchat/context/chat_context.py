"""ChatContext: the conversation as the user sees it, and what the model is shown of it.

The history is never shortened; when the context fills, the context policy (budget.py) decides
which old turns the model stops seeing and what summary stands in for them. The engine then
removes those turns from its KV cache by shifting, so the kept turns are not evaluated again
(an approximation it allows this conversation only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from localchat.context.budget import draft_may_be_prefilled
from localchat.context.draft import DraftPrefill
from localchat.context.keeper import ContextKeeper
from localchat.context.message import Message
from localchat.context.turn_engine import TurnEngine
from localchat.engine.options import Sampling
from localchat.engine.turn import TurnHandle
from localchat.events import Done, Failed, Turn
from localchat.reply.calls import ToolResult


class TurnRouter(Protocol):
    """Where a turn runs when it may leave the local engine. The session knows no remote: the
    chat layer passes one in (``chat.escalation.Escalation``) for a turn that may be escalated."""

    @property
    def takes_overlong(self) -> bool:
        """Whether a message the local context cannot hold goes elsewhere instead of being
        refused."""
        ...

    def start(self, messages: list[dict[str, str]], local: Callable[[], Turn], *,
              overlong: bool, sampling: Sampling) -> Turn:
        """Start the turn over ``messages``; ``local`` starts the local reply (if it is to answer).
        ``overlong``: the local context cannot hold the message."""
        ...


class ChatContext:
    """One conversation over one engine. ``send`` returns at once; the reply streams as events."""

    def __init__(
        self,
        engine: TurnEngine,
        *,
        system: str = "",
        history: list[Message] | tuple[Message, ...] = (),
        sampling: Sampling | None = None,
    ) -> None:
        self.engine = engine
        self.system = system
        self.history: list[Message] = list(history)
        self.sampling = sampling or Sampling()
        self.summary = ""
        self.summary_in_context = True
        # Applies the context budget (trimming, summaries) when the engine supports it.
        self.keeper: ContextKeeper | None = None
        # Time spent restoring a saved KV cache before this session's next turn: it is part of
        # what the user waits for, so it is added to that turn's TTFT (and shown as restore_ms).
        self.pending_restore_ms: float | None = None
        # Index into history of the first message the model still sees (earlier ones were trimmed).
        self.first_visible = 0
        # Guards the window (history, first_visible, summary) against the background summary
        # swap. Reentrant: a reply that ends at once runs its callbacks inside ``send``.
        self.state_lock = threading.RLock()
        self._current: Turn | None = None
        # The messages the last turn showed the model (after trimming): what a fresh prefill
        # must reproduce (bench's exactness oracle).
        self.last_sent: list[dict[str, str]] = []
        # Cells a context shift moved in the last turn: a draft is then not prefilled (see draft.py).
        self.last_approx_n = 0
        # The tools the last turn offered, and (set by whoever holds the tools) those the next
        # would offer now: a background prefill (a draft, a new system prompt) renders them too,
        # so that the next turn reuses it, its first one included.
        self.offered_tools: tuple[dict[str, Any], ...] = ()
        self.next_tools: Callable[[], tuple[dict[str, Any], ...]] | None = None
        self.draft = DraftPrefill(self)

    # -- what the model sees -------------------------------------------------------------------

    def model_messages(self, *, summary: str | None = None, first_visible: int | None = None
                       ) -> list[dict[str, str]]:
        """System prompt, summary (as a user/assistant pair, which every template accepts),
        then the turns still in context, oldest first. ``summary``/``first_visible`` give the
        window as it would be with another summary and another first turn."""
        if summary is None:
            summary = self.summary if self.summary_in_context else ""
        first = self.first_visible if first_visible is None else first_visible
        messages: list[dict[str, str]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        if summary:
            messages.append({"role": "user", "content": summary_request(summary)})
            messages.append({"role": "assistant", "content": SUMMARY_ACK})
        messages.extend(m.as_dict() for m in self.history[first:])
        return messages

    # -- turns ---------------------------------------------------------------------------------

    def send(self, text: str, sampling: Sampling | None = None, *,
             router: TurnRouter | None = None, images: tuple[bytes, ...] = ()) -> Turn:
        """Add the user's message (with ``images``: its pictures' file bytes) and start the
        reply (with a ``router``, a turn that may be handed to another model). The reply, also
        a stopped one, is added to the history before the final event reaches the reader."""
        sampling = sampling or self.sampling
        self.draft.cancel()  # no more steps; the submit below stops a running one at once
        remote_ready = router is not None and router.takes_overlong
        with self.state_lock:
            if self._current is not None and not self._current.finished:
                raise RuntimeError("a reply is still running; stop it first")
            refusal = None
            if self.keeper is not None:
                text, refusal = self.keeper.make_room(self, text)
                if refusal is not None and not remote_ready:
                    return refused(refusal)
            self.history.append(Message("user", text, images=tuple(images)))
            return self._start(sampling, router, overlong=refusal is not None)

    def resume(self, sampling: Sampling | None = None, *,
               router: TurnRouter | None = None) -> Turn:
        """Start the next reply over the history as it stands, with no new user message: the
        model goes on after the tool results the chat's tool rounds appended (``add_results``).
        The reply is added to the history like ``send``'s."""
        sampling = sampling or self.sampling
        self.draft.cancel()
        with self.state_lock:
            if self._current is not None and not self._current.finished:
                raise RuntimeError("a reply is still running; stop it first")
            return self._start(sampling, router, overlong=False)

    def _start(self, sampling: Sampling, router: TurnRouter | None, *, overlong: bool) -> Turn:
        """Submit a reply to the history as it stands (under ``state_lock``)."""
        messages = self.model_messages()
        self.last_sent = messages
        self.offered_tools = sampling.tools
        handle: Turn
        if router is None:
            handle = self.engine.submit(messages, sampling)
        else:
            handle = router.start(messages, lambda: self.engine.submit(messages, sampling),
                                  overlong=overlong, sampling=sampling)
        handle.on_finish(self._record_reply)
        self._current = handle
        return handle

    def add_results(self, results: list[ToolResult]) -> None:
        """The results of the last reply's calls, as ``tool`` messages after it."""
        with self.state_lock:
            self.history.extend(Message("tool", r.content, tool_call_id=r.call_id, name=r.name)
                                for r in results)

    def _record_reply(self, event: Done | Failed) -> None:
        if isinstance(event, Done) and self.pending_restore_ms is not None:
            event.timings.restore_ms = self.pending_restore_ms
            event.timings.ttft_ms += self.pending_restore_ms
            self.pending_restore_ms = None
        if isinstance(event, Done):
            self.last_approx_n = event.timings.approx_n
            stopped = event.finish_reason == "aborted"
            # A stopped reply's calls never run: it is kept as the text the model wrote.
            calls = () if stopped else event.tool_calls
            self.history.append(Message("assistant", event.reply, stopped=stopped, tool_calls=calls))
            if self.keeper is not None:
                in_context = self.summary and self.summary_in_context
                event.timings.summary_n = self.keeper.summary_text_tokens if in_context else 0
                moved = self.keeper.take_trimmed_in_background()
                if moved:  # turns folded into the summary or trimmed ahead since the last turn
                    event.timings.trimmed_n += moved
                rebuilt_n, rebuilt_ms = self.keeper.take_rebuilt_in_background()
                event.timings.rebuild_background_n += rebuilt_n
                event.timings.rebuild_background_ms += rebuilt_ms
                self.keeper.after_reply(self)

    def stop(self) -> None:
        current = self._current
        if current is not None:
            current.stop()

    def tools_for_prefill(self) -> tuple[dict[str, Any], ...]:
        """The tools a background prefill renders: those the next turn would offer."""
        return self.next_tools() if self.next_tools is not None else self.offered_tools

    def draft_messages(self, draft: str, images: tuple[bytes, ...] = ()
                       ) -> list[dict[str, Any]] | None:
        """What prefilling ``draft`` (with ``images``) as the next user message means for the
        model: the messages to prepare, or None when it must not be done now (see draft.py: a
        turn or a summary is running, or the next turn may trim the context: its words are
        counted, not its pictures, as the keeper sizes a turn)."""
        with self.state_lock:
            if self.busy or self.last_approx_n:
                return None
            keeper = self.keeper
            if keeper is not None:
                if keeper.in_flight is not None:
                    return None
                engine = keeper.engine  # it measures what the cache holds
                needed = (engine.tokens_in_context + engine.count_tokens(draft)
                          + engine.template_overhead())
                if not draft_may_be_prefilled(keeper.settings, needed):
                    return None
            return self.model_messages() + [Message("user", draft, images=images).as_dict()]

    @property
    def busy(self) -> bool:
        current = self._current
        return current is not None and not current.finished

    # -- editing -------------------------------------------------------------------------------

    def set_system(self, text: str) -> TurnHandle | None:
        """Change the system prompt. Every cached cell after it must be computed again, so the
        engine starts on that in the background now rather than when the next message waits
        (the handle of that work, or None when there is nothing to prepare)."""
        with self.state_lock:
            changed = text != self.system
            self.system = text
            messages = self.model_messages() if changed and self.history and not self.busy else None
        return self.engine.prepare(messages, self.tools_for_prefill()) if messages is not None else None

    def clear(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.history.clear()
        self.summary = ""
        self.summary_in_context = True
        self.first_visible = 0
        if self.keeper is not None:
            self.keeper.reset()

    def rewind(self, n_messages: int) -> None:
        """Keep only the first ``n_messages`` of the history (an edit or a branch switch). Turns
        a summary stood in for may be among those dropped: the summary then goes too, and the
        window starts over from the first message."""
        with self.state_lock:
            del self.history[n_messages:]
            if n_messages < self.first_visible:
                self.summary, self.summary_in_context, self.first_visible = "", True, 0
                if self.keeper is not None:
                    self.keeper.reset()


def refused(message: str) -> TurnHandle:
    """A turn that ends at once with ``message`` (nothing was sent to the model)."""
    handle = TurnHandle()
    handle.emit(Failed(message))
    return handle


SUMMARY_ACK = "Understood. I will keep that earlier conversation in mind."


def summary_request(summary: str) -> str:
    return f"Summary of our earlier conversation, for context:\n{summary}"
