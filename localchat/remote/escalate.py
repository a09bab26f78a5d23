"""Who answers a turn: the local model, the remote one, or the local one first and then the remote.

:class:`Escalator` is created once per chat session (it remembers the user's answer in mode
``ask``) and starts each turn with :meth:`Escalator.start_turn`, which returns an
:class:`EscalatedTurn` — a ``localchat.events.Turn`` like a local one, with one stream of
events:

``PrefillProgress``/``Token`` (local) … ``RouteChanged("remote")`` ``Token`` (remote) …
``RouteChanged("local")`` … then exactly one ``Done`` or ``Failed``.

- ``Done.reply`` is always the answer to keep; ``Done.timings.route`` / ``route_reason`` /
  ``model`` say who answered and why. Tokens are for live display: after a ``Notice`` of kind
  ``escalate`` they belong to the remote reply, after one of kind ``fallback`` the remote text
  shown so far is void. ``EscalatedTurn.outcome`` tells the same after the end, plus the local
  partial reply that was kept when a reply was escalated mid-way (superseded: shown apart, never
  sent to the remote, never in the history) and how many local tokens it cost.
- Escalation decides early: the rules before any local token, then the confidence monitor within
  the first tokens. One that comes after more than ``LATE_AFTER_TOKENS`` local tokens (a loop, a
  full context) says ``late, after N local tokens:`` first in its route_reason.
- Notice kinds: ``breaker`` (remote marked down: automatic escalation skipped), ``offer``
  (mode ``ask`` with no way to ask: the remote could do better), ``retry`` (from the client),
  ``images`` (pictures the remote does not read: the turn stays local).

A turn whose answer must follow a GBNF grammar stays local (no remote takes one; a JSON shape
travels as ``response_format``), and a forced remote one fails in one line. So does a turn whose
user message has pictures when the remote does not read them (``[remote] images = false``, the
default): it stays local with a ``Notice`` of kind ``images`` saying why (a forced remote one
fails in one line), and no image byte is sent (``image_wire``). With ``images = true`` it is
routed as any other turn, its pictures (and earlier messages') sent as ``image_url`` parts.

Rules kept here: with mode ``off`` or no ``base_url`` there is no client at all; a failed
*automatic* escalation falls back to the local reply with a notice, never to another remote and
never silently; a *user-forced* remote turn that fails ends in ``Failed`` (one line).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from localchat import paths
from localchat.engine.options import Sampling
from localchat.events import Done, Event, Failed, Notice, RouteChanged, Token, Turn, TurnEnd
from localchat.remote import router
from localchat.remote.breaker import CircuitBreaker
from localchat.remote.client import RemoteClient
from localchat.remote.confidence import LATE_AFTER_TOKENS, ConfidenceMonitor, scaled
from localchat.remote.context import trim_to_budget
from localchat.remote.image_wire import turn_has_images, with_images
from localchat.settings.remote import RemoteSettings

Route = Literal["local", "remote", "auto"]
BREAKER_FILE = "remote_breaker.json"
GRAMMAR_STAYS_LOCAL = ("this answer follows a grammar, which only the local model can be held to; "
                       "it cannot be sent to the remote")
IMAGES_STAY_LOCAL = ("the remote model does not read pictures ([remote] images = false in "
                     "config.toml): a message with pictures stays with the local model")
# A turn that had to go to the remote (forced, or too long for the local context): it fails.
IMAGES_NOT_SENT = ("the remote model does not read pictures ([remote] images = false in "
                   "config.toml): a message with pictures cannot be sent to it")


AskUser = Callable[[str], bool]
"""Asks the user one yes/no question (mode ``ask``). Called on the thread iterating the turn; it
may block until the user answers."""


@dataclass(frozen=True)
class TurnOutcome:
    route: str  # "local" | "remote": who wrote Done.reply
    route_reason: str
    escalated: bool = False  # the remote was asked to answer this turn
    fell_back: bool = False  # ...and failed, so the local reply stands
    local_partial: str | None = None  # local text kept when a reply was escalated mid-way
    local_tokens: int = 0  # local tokens generated before the hand-over (the waste)
    late: bool = False  # handed over after more than LATE_AFTER_TOKENS local tokens


class Escalator:
    """Routes the turns of one chat session. Build it with :meth:`from_settings`."""

    def __init__(self, settings: RemoteSettings, client: RemoteClient | None,
                 ask_user: AskUser | None = None) -> None:
        self.settings = settings
        self.client = client
        self.ask_user = ask_user
        self.ask_choice: bool | None = None  # the user's answer in mode "ask", kept for the session

    @classmethod
    def from_settings(cls, settings: RemoteSettings, *, ask_user: AskUser | None = None,
                      breaker_file: Path | None = None) -> Escalator:
        """An escalator for ``settings``. A client (and the breaker's state file, by default
        ``cache_dir()/remote_breaker.json``) exists only when the remote is enabled."""
        if not settings.enabled:
            return cls(settings, None, ask_user)
        breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown_s,
                                 base_url=settings.base_url,
                                 state_file=breaker_file or paths.cache_dir() / BREAKER_FILE)
        return cls(settings, RemoteClient(settings, breaker=breaker), ask_user)

    def start_turn(
        self,
        messages: list[dict],
        local: Callable[[], Turn],
        *,
        route: Route = "auto",
        sampling: Sampling | None = None,
        local_room_tokens: int | None = None,
        prompt_tokens: int | None = None,
        local_params: int | None = None,
    ) -> EscalatedTurn:
        """Start a turn. ``messages`` is the conversation as the local model sees it, ending with
        the new user message (what the remote gets, trimmed to its budget); ``local`` starts the
        local reply (called at most once, and only if the local model is to answer).
        ``local_room_tokens``/``prompt_tokens`` feed the router's fit rule (see router.decide);
        ``local_params``, the local model's parameter count, sets the rules' threshold and the
        confidence limits (a smaller model escalates more)."""
        return EscalatedTurn(self, messages, local, route, sampling or Sampling(),
                             local_room_tokens, prompt_tokens, local_params)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def __repr__(self) -> str:
        return f"<Escalator mode={self.settings.mode} client={self.client!r}>"


class EscalatedTurn(TurnEnd):
    """One routed turn. Iterate once for its events; ``stop()`` from any thread. The events are
    produced as they are read: the final one (and the ``on_finish`` callbacks) on the reader's
    thread."""

    def __init__(self, escalator: Escalator, messages: list[dict], local: Callable[[], Turn],
                 route: Route, sampling: Sampling, local_room_tokens: int | None,
                 prompt_tokens: int | None, local_params: int | None = None) -> None:
        super().__init__()
        self._esc = escalator
        self._messages = messages
        self._start_local = local
        self._route = route
        self._sampling = sampling
        self._room = local_room_tokens
        self._prompt_tokens = prompt_tokens
        self._local_params = local_params
        self._lock = threading.Lock()
        self._current: Turn | None = None
        self._stopped = False
        self.outcome: TurnOutcome | None = None  # set when the final event is yielded

    def __iter__(self) -> Iterator[Event]:
        for event in self._read(self._events()):
            if isinstance(event, (Done, Failed)):
                yield self._finish(event)
                return
            yield event

    def _events(self) -> Iterator[Event]:
        if self._route == "local":
            return self._local("user: local", watch=False)
        if self._local_only_shape():
            if self._route == "remote":
                return self._refused(GRAMMAR_STAYS_LOCAL)
            return self._local("local: a grammar only the local model follows", watch=False)
        if self._pictures_stay_local():
            if self._route == "remote":
                return self._refused(IMAGES_NOT_SENT)
            return self._local_with_notice(Notice(IMAGES_STAY_LOCAL, kind="images"),
                                           "local: pictures the remote does not read")
        if self._route == "remote":
            return self._forced_remote()
        return self._auto()

    def _pictures_stay_local(self) -> bool:
        """The turn has pictures and there is a remote, which does not read them."""
        return (self._esc.client is not None and not self._esc.settings.images
                and turn_has_images(self._messages))

    def _local_with_notice(self, notice: Notice, reason: str) -> Iterator[Event]:
        yield notice
        # No confidence watch: it would hand the turn to a remote that cannot take it.
        yield from self._local(reason, watch=False)

    def _local_only_shape(self) -> bool:
        """The answer must follow a grammar no remote can be asked for (a GBNF one)."""
        return self._sampling.constraint is not None and self._sampling.response_format is None

    def _refused(self, message: str) -> Iterator[Event]:
        self.outcome = TurnOutcome("remote", "user: remote")
        yield Failed(message)

    def stop(self) -> None:
        """Stop whichever reply is running; no escalation starts after this."""
        self._stop_reading()
        with self._lock:
            self._stopped = True
            current = self._current
        if current is not None:
            current.stop()

    # -- routes --------------------------------------------------------------------------------

    def _forced_remote(self) -> Iterator[Event]:
        reason = "user: remote"
        client = self._esc.client
        if client is None:
            self.outcome = TurnOutcome("remote", reason)
            yield Failed('the remote model is off: set [remote] mode = "ask" or "auto" and base_url '
                         "in config.toml")
            return
        remote = self._begin(lambda: client.stream(self._remote_messages(), self._sampling,
                                                   route_reason=reason))
        for event in remote:
            if isinstance(event, (Done, Failed)):
                self.outcome = TurnOutcome("remote", reason)
            if isinstance(event, Failed) and client.breaker.status().state == "open":
                event = Failed(f"{event.message} ({client.breaker.describe()})")
            yield self._labelled(event, "remote", reason)

    def _auto(self) -> Iterator[Event]:
        settings = self._esc.settings
        if self._esc.client is None:
            reason = "local: remote off" if settings.mode == "off" else "local: no remote base_url"
            yield from self._local(reason, watch=False)
            return
        prompt = str(self._messages[-1].get("content") or "") if self._messages else ""
        decision = router.decide(prompt, settings.router, local_room_tokens=self._room,
                                 prompt_tokens=self._prompt_tokens, local_params=self._local_params)
        if not decision.escalate:
            yield from self._local(f"local: {decision.reason}", watch=True)
            return
        reason = f"rules: {decision.reason}"
        notice, go = self._may_escalate(reason)
        if notice:
            yield notice
        if go:
            yield from self._escalate(reason, local_done=None)
        else:
            yield from self._local(_declined(reason, notice), watch=False)

    def _local(self, reason: str, *, watch: bool, outcome: TurnOutcome | None = None) -> Iterator[Event]:
        """The local reply. With ``watch``, hand it to the remote when the confidence monitor
        fires. ``outcome`` is what to record if the local reply ends the turn."""
        outcome = outcome or TurnOutcome("local", reason)
        handle = self._begin(self._start_local)
        events = iter(handle)
        thresholds = scaled(self._esc.settings.confidence, self._local_params)
        monitor = ConfidenceMonitor(thresholds) if watch else None
        produced = 0  # local tokens so far: what a hand-over now would throw away
        for event in events:
            produced += isinstance(event, Token)
            trigger = monitor.watch(event) if monitor is not None else None
            if trigger is None and not isinstance(event, (Done, Failed)):
                yield event
                continue
            if trigger is not None:
                if isinstance(event, Token):
                    yield event
                escalation_reason = f"{trigger.kind}: {trigger.reason}"
                late = produced > LATE_AFTER_TOKENS
                if late:  # said first: the local work was wasted and the user waited for it
                    escalation_reason = f"late, after {produced} local tokens: {escalation_reason}"
                notice, go = self._may_escalate(escalation_reason)
                if notice:
                    yield notice
                if go:
                    local_done = event if isinstance(event, Done) else _drain(handle, events)
                    yield from self._escalate(escalation_reason, local_done=local_done,
                                              local_tokens=produced, late=late)
                    return
                monitor = None  # asked, refused or skipped once: let the local reply finish
                reason = _declined(escalation_reason, notice)
                outcome = TurnOutcome("local", reason)
                if isinstance(event, Token):
                    continue
            self.outcome = outcome
            yield self._labelled(event, "local", reason, fell_back=outcome.fell_back)
            return

    def _escalate(self, reason: str, *, local_done: Done | None, local_tokens: int = 0,
                  late: bool = False) -> Iterator[Event]:
        """Hand the turn to the remote. ``local_done``: the local reply already produced (kept if
        the remote fails, shown as superseded otherwise); None when the rules escalated before
        any local generation. The remote gets the conversation as it was before this turn's
        reply: the superseded local text is never sent."""
        client = self._esc.client
        assert client is not None
        partial = local_done.reply if local_done else None
        # What the local reply cost, whoever ends up answering.
        spent = TurnOutcome("local", reason, local_partial=partial, local_tokens=local_tokens,
                            late=late)
        if self._stopped:
            self.outcome = spent
            yield self._labelled(local_done or Done("", "aborted"), "local", reason)
            return
        route_reason = f"auto: {reason}"
        yield RouteChanged("remote", f"asking {self._esc.settings.model or 'the remote model'}: {reason}")
        remote = self._begin(lambda: client.stream(self._remote_messages(), self._sampling,
                                                   route_reason=route_reason))
        for event in remote:
            if isinstance(event, Done):
                self.outcome = replace(spent, route="remote", route_reason=route_reason,
                                       escalated=True)
                yield self._labelled(event, "remote", route_reason)
                return
            if not isinstance(event, Failed):
                yield event
                continue
            fallback = f"fallback: remote failed ({event.message})"
            outcome = replace(spent, route_reason=fallback, escalated=True, fell_back=True)
            if local_done is not None:
                # Not "stopped": the hand-over cut it, and it is the answer now.
                cut = " up to the hand-over" if local_done.finish_reason == "aborted" else ""
                yield RouteChanged("local", f"{event.message}; keeping the local reply{cut}")
                self.outcome = outcome
                yield self._labelled(local_done, "local", fallback, fell_back=True)
            else:
                yield RouteChanged("local", f"{event.message}; answering locally")
                # Never a second remote attempt, and no confidence watch: it would escalate again.
                yield from self._local(fallback, watch=False, outcome=outcome)
            return

    def _may_escalate(self, reason: str) -> tuple[Notice | None, bool]:
        """Whether an automatic escalation for ``reason`` may go ahead, and what to tell the user."""
        esc = self._esc
        assert esc.client is not None
        if self._stopped:
            return None, False
        if not esc.client.breaker.allows_request():
            return Notice(f"not escalating ({reason}): {esc.client.breaker.describe()}",
                          kind="breaker"), False
        if esc.settings.mode == "auto":
            return None, True
        if esc.ask_choice is None and esc.ask_user is not None:
            esc.ask_choice = bool(esc.ask_user(f"The remote model could answer this better "
                                               f"({reason}). Send it there?"))
        if esc.ask_choice is None:
            return Notice(f"the remote model could answer this better ({reason}); "
                          "use /big or --route remote", kind="offer"), False
        return None, esc.ask_choice

    # -- plumbing ------------------------------------------------------------------------------

    def _begin(self, start: Callable[[], Turn]) -> Turn:
        handle = start()
        with self._lock:
            self._current = handle
            stopped = self._stopped
        if stopped:
            handle.stop()  # stop() came while this reply was being started
        return handle

    def _remote_messages(self) -> list[dict]:
        settings = self._esc.settings
        reserve = settings.max_tokens or self._sampling.max_tokens
        # Pictures a remote does not read are notes already here, so they cost it no budget.
        messages = self._messages if settings.images else with_images(self._messages,
                                                                       reads_images=False)
        return trim_to_budget(messages, settings.max_context_tokens, reserve)

    def _labelled(self, event: Event, route: str, reason: str, *, fell_back: bool = False) -> Event:
        """``event`` with the route stamped into its timings, when it is a Done."""
        if not isinstance(event, Done):
            return event
        model = event.timings.model or (self._esc.settings.model if route == "remote" else "")
        return replace(event, timings=replace(event.timings, route=route, route_reason=reason,
                                              fell_back=fell_back, model=model))


def _declined(reason: str, notice: Notice | None) -> str:
    """route_reason of a turn that stayed local although a rule wanted the remote."""
    why = notice.kind if notice else "declined"  # "breaker", "offer", or the user said no
    return f"local ({why}): {reason}"


def _drain(handle: Turn, events: Iterator[Event]) -> Done:
    """Stop a local reply and read its remaining events up to the final Done (the kept partial)."""
    handle.stop()
    final: Done | None = None
    for event in events:
        if isinstance(event, Done):
            final = event
        elif isinstance(event, Failed):
            break
    return final or Done("", "aborted")
