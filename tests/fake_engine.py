"""A scripted stand-in for ``localchat.engine.Engine``, for UI tests that need no model.

It has the engine's methods and threading shape: ``submit`` returns at once with the engine's
own ``TurnHandle``, a worker thread produces the turn's events (turns queue up and run one at a
time), and iterating the handle blocks per event. Replies are scripted
(a fixed text or a function of the messages), streamed one word-sized token at a time at a
chosen pace, and end with a ``Done`` whose ``Timings`` are measured like the real engine's.

Knobs for tests:
- ``token_delay``: seconds between tokens (0 streams as fast as the consumer reads).
- ``hold_after=N``: emit N tokens, then wait until stopped (a reply that is reliably mid-stream
  when a test presses Esc, with no timing involved), or until ``release`` (an Event) is set.
- ``load_error`` / ``turn_error``: make ``load`` raise ``EngineError`` / a turn end in ``Failed``.
- ``load_gate``: a ``threading.Event`` that ``load`` waits for (a model that is "still loading").
- Reasoning: a script with ``<think>…</think>`` streams its reasoning as ``Thinking`` events (the
  engine's own splitter); ``thinking_switch=True`` makes it a model whose template takes
  ``enable_thinking`` (``supports_thinking``); ``samplings`` records each turn's Sampling.

It implements every protocol the app has for an engine (``localchat.tui.model_state.AppEngine``;
mypy checks that at the end of this file), so a stored conversation over it gets the context
keeper and KV snapshots as over the real one. Its "KV cache" is the token record of the last
turn (each message's words plus ``TEMPLATE_TOKENS``, then the reply's); a snapshot is that record.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.engine.layout import CachedMessage
from localchat.engine.snapshot_file import KVSnapshot
from localchat.engine.turn import TurnHandle
from localchat.errors import EngineError
from localchat.events import (
    Done,
    Failed,
    FinishReason,
    Loaded,
    PrefillProgress,
    Thinking,
    Timings,
    Token,
)
from localchat.reply.reasoning import ReasoningSplitter

if TYPE_CHECKING:
    from fake_tools import ToolRound

    from localchat.engine.engine import Engine
    from localchat.tui.app_engine import AppEngine

ReplyScript = str | Callable[[list[dict[str, str]]], str]

DEFAULT_REPLY = "Hello! Here is some `code`:\n\n```python\nprint('hi')\n```\n\nAnything else?"

_TOKEN = re.compile(r"\s*\S+|\s+")

# What the template adds per message (role header, end marker): all the fake's template tokens.
TEMPLATE_TOKENS = 4
_MARKER = 0  # the id of a template token (detokenized as nothing)


def split_tokens(text: str) -> list[str]:
    """Word-sized pieces whose concatenation is ``text`` (leading whitespace kept, like BPE)."""
    return _TOKEN.findall(text)


class FakeEngine:
    """Implements the methods of ``localchat.engine.Engine`` with a scripted model."""

    can_trim_in_place = True  # dropping old turns keeps the later cells

    def __init__(
        self,
        name: str = "fake-model",
        *,
        reply: ReplyScript = DEFAULT_REPLY,
        token_delay: float = 0.0,
        hold_after: int | None = None,
        load_error: str | None = None,
        load_gate: threading.Event | None = None,
        turn_error: str | None = None,
        n_ctx: int = 4096,
        gpu_layers: int = 0,
        n_layers: int = 30,
        thinking_switch: bool = False,
        release: threading.Event | None = None,
        tools: ToolRound | None = None,
    ) -> None:
        self.model_path = Path(f"/models/{name}.gguf")
        self.n_params: int | None = None  # no GGUF header to tell
        self.name = name
        self.reply = reply
        self.token_delay = token_delay
        self.hold_after = hold_after
        self.load_error = load_error
        self.load_gate = load_gate
        self.turn_error = turn_error
        self.n_ctx = n_ctx
        self.supports_thinking = thinking_switch
        self.release = release
        self.tools = tools
        self.samplings: list[object] = []
        self._layers = (gpu_layers, n_layers)
        self.info: Loaded | None = None
        # What tests inspect afterwards.
        self.submitted: list[list[dict[str, str]]] = []
        self.prepared: list[list[dict[str, str]]] = []
        self.prepared_tools: list[tuple[dict[str, Any], ...]] = []
        self.closed = False
        self._current: TurnHandle | None = None
        self._background: list[TurnHandle] = []  # queued or running; the next turn stops them
        self._one_turn_at_a_time = threading.Lock()
        # Like a KV cache: the previous turn's prompt + reply, as a count and per message.
        self._cache_lock = threading.Lock()
        self._cached_tokens = 0
        self._records: list[CachedMessage] = []
        self._vocabulary: dict[str, int] = {"": _MARKER}  # word-sized piece -> token id
        self._pieces = [""]  # token id -> piece

    def __repr__(self) -> str:
        return f"FakeEngine({self.name!r}, loaded={self.info is not None})"

    def load(self, on_progress: Callable[[float], None] | None = None) -> Loaded:
        for step in range(5):
            if on_progress:
                on_progress(step / 4)
        if self.load_gate is not None:
            self.load_gate.wait()
        if self.load_error:
            raise EngineError(self.load_error)
        gpu, total = self._layers
        self.info = Loaded(self.name, self.n_ctx, gpu, total, "CUDA" if gpu else "CPU", load_ms=12.0)
        return self.info

    def preflight(self) -> None:
        """Nothing to check: there is no file."""

    def count_tokens(self, text: str) -> int:
        return len(split_tokens(text))

    def tokenize(self, text: str) -> list[int]:
        return self._token_ids(split_tokens(text))

    def _token_ids(self, pieces: list[str]) -> list[int]:
        with self._cache_lock:
            for piece in pieces:
                if piece not in self._vocabulary:
                    self._vocabulary[piece] = len(self._pieces)
                    self._pieces.append(piece)
            return [self._vocabulary[piece] for piece in pieces]

    def detokenize(self, tokens: list[int]) -> str:
        with self._cache_lock:
            return "".join(self._pieces[token] for token in tokens)

    def template_overhead(self) -> int:
        return TEMPLATE_TOKENS

    def prompt_tokens(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> int:
        return sum(self.count_tokens(m["content"]) + TEMPLATE_TOKENS for m in messages)

    # -- the "KV cache": what the context keeper measures and a snapshot holds -----------------

    @property
    def tokens_in_context(self) -> int:
        return self._cached_tokens

    def cached_messages(self) -> list[CachedMessage]:
        with self._cache_lock:
            return [replace(r, tokens=list(r.tokens)) for r in self._records]

    def fingerprint(self) -> dict[str, Any]:
        return {"model": self.name, "n_ctx": self.n_ctx}

    def export_snapshot(self) -> KVSnapshot:
        records = self.cached_messages()
        return KVSnapshot(records, b"", sum(len(r.tokens) for r in records))

    def import_snapshot(self, snapshot: KVSnapshot) -> float:
        started = time.perf_counter()
        with self._cache_lock:
            self._records = [replace(r, tokens=list(r.tokens)) for r in snapshot.records]
            self._cached_tokens = snapshot.n_tokens
        return (time.perf_counter() - started) * 1000

    def reset(self) -> None:
        with self._cache_lock:
            self._records, self._cached_tokens = [], 0

    def _record_turn(self, messages: list[dict[str, str]], reply: list[str]) -> None:
        """The cache now holds ``messages`` and the ``reply`` pieces sampled after them."""
        records = [CachedMessage(m["role"], m["content"], "",
                                 self.tokenize(m["content"]) + [_MARKER] * TEMPLATE_TOKENS)
                   for m in messages]
        records.append(CachedMessage("assistant", "".join(reply), "", self._token_ids(reply), open=True))
        with self._cache_lock:
            self._records = records
            self._cached_tokens = sum(len(r.tokens) for r in records)

    # -- turns ---------------------------------------------------------------------------------

    def submit(self, messages: list[dict[str, str]], sampling: object = None, *,
               background: bool = False) -> TurnHandle:
        """A turn; a ``background`` one (a summary) leaves the cache as it found it, and the
        next foreground turn stops it, as the engine's does."""
        if self.info is None:
            raise RuntimeError("submit() before load()")
        self.submitted.append([dict(m) for m in messages])
        self.samplings.append(sampling)
        stopped = threading.Event()
        if self.tools is not None and not background:
            from fake_tools import RoundsTurnHandle

            handle: TurnHandle = RoundsTurnHandle(on_stop=lambda _handle: stopped.set())
        else:
            handle = TurnHandle(on_stop=lambda _handle: stopped.set())
        if background:
            self._background.append(handle)
        else:
            waiting, self._background = self._background, []
            for pending in waiting:
                pending.stop()
        threading.Thread(target=self._run_turn, args=(messages, handle, stopped, background),
                         daemon=True).start()
        return handle

    def prepare(self, messages: list[dict[str, str]],
                tools: tuple[dict[str, Any], ...] = ()) -> TurnHandle:
        """Nothing to precompute without a KV cache: records the request (and the tools it
        would render, in ``prepared_tools``) and ends at once."""
        self.prepared.append([dict(m) for m in messages])
        self.prepared_tools.append(tools)
        handle = TurnHandle()
        handle.emit(Done("", "stop", Timings()))
        return handle

    def stop(self) -> None:
        current = self._current
        if current is not None:
            current.stop()

    def close(self) -> None:
        self.stop()
        self.closed = True

    def _run_turn(self, messages: list[dict[str, str]], handle: TurnHandle, stop: threading.Event,
                  background: bool) -> None:
        # Like the real engine, turns queue up and run one at a time.
        with self._one_turn_at_a_time:
            self._current = handle
            try:
                handle.emit(self._turn(messages, handle, stop, background))
            finally:
                self._current = None

    def _turn(self, messages: list[dict[str, str]], handle: TurnHandle, stop: threading.Event,
              background: bool) -> Done | Failed:
        out = handle
        started = handle.submitted_at
        prompt_tokens = self.prompt_tokens(messages)
        cache_n = min(self._cached_tokens, prompt_tokens)
        prompt_n = prompt_tokens - cache_n
        for done in range(0, prompt_n, 64):
            out.emit(PrefillProgress(done, prompt_n))
        out.emit(PrefillProgress(prompt_n, prompt_n))
        prompt_ms = (time.perf_counter() - started) * 1000
        if self.turn_error:
            return Failed(self.turn_error)

        script = self.reply(messages) if callable(self.reply) else self.reply
        pieces: list[str] = []
        sent_at: list[float] = []
        reasoning: list[str] = []
        thinking_n, answer_at = 0, None

        def stream(text: str) -> FinishReason:
            nonlocal thinking_n, answer_at
            splitter = ReasoningSplitter()  # each reply of a turn may reason first
            for index, piece in enumerate(split_tokens(text)):
                if self.hold_after is not None and index >= self.hold_after:
                    while not stop.wait(0.01) and not (self.release and self.release.is_set()):
                        pass
                if stop.is_set():
                    return "aborted"
                if self.token_delay:
                    time.sleep(self.token_delay)
                was_thinking = splitter.thinking
                thinking, answer = splitter.feed(piece)
                thinking_n += was_thinking or splitter.thinking
                if answer and answer_at is None:
                    answer_at = time.perf_counter()
                if thinking:
                    reasoning.append(thinking)
                    out.emit(Thinking(thinking))
                if answer or not splitter.thinking:
                    out.emit(Token(answer, token_id=index))
                pieces.append(piece)
                sent_at.append(time.perf_counter())
            return "stop"

        finish = stream(script)
        if self.tools is not None and not background and finish == "stop":
            finish = self._tool_round(out, stop, "".join(pieces), started, prompt_ms, cache_n, prompt_n,
                                      sent_at)
            if finish == "stop":
                pieces.clear()  # the final Done is the next reply's (the first one's went before)
                reasoning.clear()
                finish = stream(self.tools.then)

        reply = "".join(pieces)
        if not background:
            self._record_turn(messages, pieces)
        timings = self._timings(started, prompt_ms, cache_n, prompt_n, sent_at)
        timings.thinking_n = thinking_n
        timings.time_to_answer_ms = (answer_at - started) * 1000 if answer_at else 0.0
        return Done(reply, finish, timings, "".join(reasoning))

    def _tool_round(self, out: TurnHandle, stop: threading.Event, reply: str, started: float,
                    prompt_ms: float, cache_n: int, prompt_n: int, sent_at: list[float]) -> FinishReason:
        """The scripted tool round after the first reply (see tests/fake_tools.py)."""
        tools = self.tools
        assert tools is not None
        if tools.round_done:
            from fake_tools import RoundsTurnHandle

            calls = tuple(call for call, _ in tools.calls)
            assert isinstance(out, RoundsTurnHandle)
            out.end_round(Done(reply, "stop", self._timings(started, prompt_ms, cache_n, prompt_n, sent_at),
                               tool_calls=calls))
        return "stop" if tools.play(out.emit, stop) else "aborted"

    def _timings(self, started: float, prompt_ms: float, cache_n: int, prompt_n: int, sent_at: list[float]) -> Timings:
        gaps = sorted((b - a) * 1000 for a, b in zip(sent_at, sent_at[1:]))
        decode_ms = (sent_at[-1] - sent_at[0]) * 1000 if len(sent_at) > 1 else 0.0
        return Timings(
            cache_n=cache_n,
            prompt_n=prompt_n,
            prompt_ms=prompt_ms,
            predicted_n=len(sent_at),
            predicted_ms=(sent_at[-1] - started) * 1000 - prompt_ms if sent_at else 0.0,
            ttft_ms=(sent_at[0] - started) * 1000 if sent_at else 0.0,
            tpot_ms=decode_ms / (len(sent_at) - 1) if len(sent_at) > 1 else 0.0,
            itl_p50_ms=gaps[len(gaps) // 2] if gaps else 0.0,
            itl_p95_ms=gaps[int(len(gaps) * 0.95)] if gaps else 0.0,
            n_ctx=self.n_ctx,
            n_ctx_used=self._cached_tokens,
            model=self.name,
        )


if TYPE_CHECKING:
    def _both_are_app_engines(fake: FakeEngine, real: Engine) -> list[AppEngine]:
        """mypy's proof that the fake and the real engine implement every engine protocol."""
        return [fake, real]


# --- driving the app with a fake engine -------------------------------------------------------

SIZE = (80, 24)  # the smallest terminal the app promises to work in


class NoDownloads:
    """Nothing to download: a missing model stays a notice (see test_tui_download.py)."""

    def offer(self, model_ref):
        return None

    def pull(self, model, progress):
        raise AssertionError("nothing to pull")


def make_app(store: Any, engine: FakeEngine | None = None, **options: Any):
    """A ``LocalChatApp`` over ``store`` whose model is ``engine`` (a default FakeEngine if None).

    Every model name maps to the same fake unless ``engine_factory`` is given in ``options``."""
    from localchat.tui.app import LocalChatApp

    engine = engine or FakeEngine()
    options.setdefault("engine_factory", lambda ref: engine)
    options.setdefault("sampling_factory", lambda: None)
    options.setdefault("list_models", lambda: [("fake-model", True), ("other-model", True)])
    options.setdefault("downloads", NoDownloads())
    return LocalChatApp(store=store, **options)


async def wait_until(pilot, condition: Callable[[], bool], what: str = "condition", timeout: float = 10.0) -> None:
    """Let the app run until ``condition()`` holds; fail with ``what`` after ``timeout`` seconds.

    Polls with a plain sleep, not ``pilot.pause``: that forces a screen refresh each time, and a
    busy UI thread slows the real engine's prefill (its abort callback needs the GIL)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{_what_it_shows(pilot.app)}")
        await asyncio.sleep(0.02)


def _what_it_shows(app) -> str:
    """The screen and the notifications, for a failure to say what the app did instead."""
    try:
        shown = "\n".join(line.rstrip() for line in screen_lines(app) if line.strip())
        return f"the screen:\n{shown}\nnotices: {notices(app)}"
    except Exception as exc:  # a failure's report must not fail
        return f"(the screen could not be read: {exc!r})"


def screen_lines(app) -> list[str]:
    """What the terminal shows now, one plain-text string per row (the top screen drawn over
    the ones below it, as Textual composes them)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def notices(app) -> list[str]:
    """The notifications the app has shown (Textual keeps them until they time out)."""
    return [n.message for n in app._notifications]


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.models.engine is not None, "the model to load")


async def send(pilot, text: str) -> None:
    """Type ``text`` into the prompt (as a paste would) and press Enter."""
    pilot.app.prompt.text = text
    await pilot.press("enter")


async def command(pilot, text: str) -> None:
    """Type a slash command and let the app handle it. The app clears the input as it takes the
    command: text typed before that would be cleared with it (a message sent right after a
    command was lost so, and its reply waited for in vain)."""
    await send(pilot, text)
    await wait_until(pilot, lambda: not pilot.app.prompt.text, f"the app to take {text}")
    await pilot.pause()


async def reply_finished(pilot) -> None:
    """Wait until the newest reply on screen has finished (done, stopped or failed)."""

    def finished() -> bool:
        reply = pilot.app.chat_log.last_reply()
        return pilot.app.turns.current is None and reply is not None and reply.finished

    await wait_until(pilot, finished, "the reply to finish")


@asynccontextmanager
async def held_mid_reply(store: Any, script: str, tokens: int, size: tuple[int, int] = (100, 30),
                         token_delay: float = 0.001):
    """A pilot on an app whose FakeEngine streams ``script`` and holds after ``tokens`` tokens,
    entered once the reply has that many; on leaving, the reply is stopped and finished."""
    app = make_app(store, FakeEngine(reply=script, token_delay=token_delay, hold_after=tokens))
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await wait_until(pilot, lambda: app.turns.current is not None
                         and app.turns.current.meter.tokens >= tokens, "the reply to pause", timeout=30)
        yield pilot
        await app.action_stop_reply()
        await reply_finished(pilot)
