"""Prefill while typing: the message being written is prefilled in the background, so that when
it is sent only what changed since is evaluated.

The engine's ``prepare`` brings the KV cache to a list of messages, reusing the cells it may
(exactly: the longest common token prefix of cells computed in order) and prefilling the rest,
abortably. Here the list is the conversation plus the draft as a user message. It goes in steps of
about ``STEP_CHARS``: each step prepares the draft up to a word boundary a little further on, and
every finished step leaves that prefix (and its end-of-turn marker) in the cache, where the next
step or the real turn reuses it up to the first token that differs. So an edit in the middle
re-prefills from the first changed token on, and nothing before it.

Pictures attached to the message go with every step (a user message starts with its pictures):
the first step encodes them while the words are still being typed (with no words yet, it
prepares the pictures alone), and each later step reuses their cells, so sending evaluates only
the words typed since. Other pictures start the draft over.

Never competes with a reply: nothing is prepared while a turn runs or a summary is being written
or installed, and sending stops a running step at once (the engine's submit does). A stopped
prepare keeps the cells it evaluated (the draft's first tokens as a partial record), so the turn
reuses them as far as its tokens agree: stopping costs nothing. Edits let the running step finish,
and the next step starts from the first changed token. Nor is it done when the next turn may trim
the context: a turn that trims shifts cached turns down, which needs the cache to end with the
conversation, not with a draft.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

from localchat.context.turn_engine import TurnEngine
from localchat.events import Done, Failed

if TYPE_CHECKING:
    from localchat.engine.turn import TurnHandle

log = logging.getLogger(__name__)

# The first step: about 50 tokens of English. Later steps are sized from the measured prefill
# speed to take about STEP_SECONDS each: an edit waits for at most that much work, while each
# step's extra end-of-turn marker and cut token (2-3 tokens) stay a small share.
STEP_CHARS = 200
STEP_SECONDS = 0.3
MAX_STEP_CHARS = 8000
CHARS_PER_TOKEN = 4  # English prose; only step sizes depend on it, never what is reused


class DraftHost(Protocol):
    """What a draft's prefill needs from its conversation (``ChatContext`` is one): the engine
    whose cache it prepares, the messages a draft means (None: not now) and the tools to render."""

    @property
    def engine(self) -> TurnEngine: ...

    def draft_messages(self, draft: str, images: tuple[bytes, ...] = ()
                       ) -> list[dict[str, Any]] | None: ...

    def tools_for_prefill(self) -> tuple[dict[str, Any], ...]: ...


class DraftPrefill:
    """The background prefill of one session's draft. ``update`` and ``cancel`` from any thread."""

    def __init__(self, session: DraftHost) -> None:
        self.session = session
        self._lock = threading.Lock()
        self._wanted = ""  # the draft as last typed
        self._wanted_images: tuple[bytes, ...] = ()  # and the pictures attached to it
        self._cached = ""  # the draft prefix the last finished step left in the cache
        self._cached_images: tuple[bytes, ...] = ()  # with these pictures
        self._running: tuple[TurnHandle, str] | None = None  # a step and the prefix it prepares
        self.steps = 0  # finished steps (tests and bench read it)
        self.step_timings: list = []  # each finished step's Timings: cache_n reused, prompt_n prefilled
        self.step_chars = STEP_CHARS

    def __repr__(self) -> str:
        return f"DraftPrefill(wanted={len(self._wanted)} chars, cached={len(self._cached)} chars)"

    def update(self, text: str, images: tuple[bytes, ...] = ()) -> None:
        """The draft is now ``text`` with ``images`` (its pictures' file bytes): prefill towards
        it. A step already running is left to finish (see ``finish``); the next one starts from
        what it and ``text`` have in common."""
        with self._lock:
            self._wanted, self._wanted_images = text, images
            if self._running is not None:
                return
        self._next_step()

    def cancel(self) -> None:
        """No further steps (the input emptied, a command, another session, or the message is
        sent: the turn's submit then stops a running step at once, and it keeps what it
        evaluated); what is cached stays."""
        with self._lock:
            self._wanted, self._wanted_images = "", ()

    @property
    def cached_text(self) -> str:
        """The draft prefix the cache holds after the last finished step."""
        return self._cached

    def _next_step(self) -> None:
        with self._lock:
            if self._running is not None:
                return
            images = self._wanted_images
            same_images = images == self._cached_images
            target = next_prefix(self._wanted, self._cached if same_images else "", self.step_chars)
            if not target and (same_images or not images):
                return
            messages = self.session.draft_messages(target, images)
            if messages is None:
                return
            handle = self.session.engine.prepare(messages, self.session.tools_for_prefill())
            self._running = (handle, target)
        handle.on_finish(lambda event: self._finished(target, images, event))

    def _finished(self, target: str, images: tuple[bytes, ...], event: Done | Failed) -> None:
        with self._lock:
            self._running = None
            if isinstance(event, Done) and event.finish_reason == "stop":
                self._cached, self._cached_images = target, images
                self.steps += 1
                self.step_timings.append(event.timings)
                self.step_chars = _step_chars(event.timings.prompt_n, event.timings.prompt_ms, self.step_chars)
            elif isinstance(event, Done) and event.timings.prompt_n:
                # Stopped mid-prefill (a turn came first): the engine kept what it evaluated, but
                # not a whole step's prefix; the next step starts over and reuses those cells.
                self._cached, self._cached_images = "", ()
        # This runs on the engine thread (the step's on_finish); sizing the next step tokenizes
        # the draft, which must not delay a turn queued behind it.
        threading.Thread(target=self._next_step_logged, name="draft-step", daemon=True).start()

    def _next_step_logged(self) -> None:
        try:
            self._next_step()
        except Exception:  # e.g. the model was closed meanwhile: the draft just is not prefilled
            log.exception("a draft prefill step could not start")


def _step_chars(prompt_n: int, prompt_ms: float, current: int) -> int:
    """A step size taking about STEP_SECONDS at the speed the last step prefilled."""
    if prompt_n < 8 or prompt_ms <= 0:  # too little measured to tell a speed
        return current
    per_second = prompt_n / (prompt_ms / 1000)
    return int(min(MAX_STEP_CHARS, max(STEP_CHARS, per_second * STEP_SECONDS * CHARS_PER_TOKEN)))


def next_prefix(wanted: str, cached: str, step: int = STEP_CHARS) -> str:
    """The draft prefix the next step should prepare: about ``step`` characters past what is cached and
    still wanted, cut after whitespace (a cut inside a word tokenizes differently from the whole
    word, which the real turn would then evaluate again), or the whole draft if that is near.
    "" when the cache already holds the whole draft."""
    if not wanted.strip() or wanted == cached:
        return ""
    common = _common_prefix(wanted, cached)
    end = common + step
    if end + step // 4 >= len(wanted):
        return wanted
    cut = max(wanted.rfind(" ", common + 1, end), wanted.rfind("\n", common + 1, end))
    return wanted[:cut + 1] if cut > common else wanted[:end]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
