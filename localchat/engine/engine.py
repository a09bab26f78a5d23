"""The engine: one thread owns the llama.cpp model and runs turns, one at a time.

Callers (TUI, ``ask``, ``bench``, the chat session) submit a turn and read typed events from the
returned TurnHandle; nothing they do blocks the engine, and the engine never calls back into them.
The engine keeps an exact record of what the KV cache holds (see layout.py), so each turn prefills
only what is new, a stop ends decoding within one token, and trimming moves cached tokens instead
of evaluating them again. It reuses a cell only when that is exact (computed in order from the
tokens before it now), except that the conversation a trim shift was made for may keep using the
shifted cells (kv.py): that is the one approximation.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from localchat import logs
from localchat.engine.fresh import fresh_logits
from localchat.engine.image_records import count_image_tokens
from localchat.engine.kv import ConversationCache, KVSnapshot
from localchat.engine.layout import CachedMessage, Layout, RawPrompt, plan_layout
from localchat.engine.loading import load_model
from localchat.engine.options import EngineOptions, Sampling
from localchat.engine.preflight import Preflight, preflight
from localchat.engine.projector_runtime import Vision
from localchat.engine.prompts import ModelPrompts
from localchat.engine.reuse import fill_cache
from localchat.engine.runtime import LlamaRuntime
from localchat.engine.sampling.constrained import TurnConstraint
from localchat.engine.snapshot_file import engine_fingerprint
from localchat.engine.speculate import Speculator
from localchat.engine.state_pool import StatePool
from localchat.engine.turn import ReplyEvents, TurnClock, TurnHandle
from localchat.engine.vocabulary import Vocabulary
from localchat.errors import ContextOverflow, EngineError, FormatError, UserError
from localchat.events import Done, Failed, Loaded, Notice, PrefillProgress, Timings
from localchat.reply.reasoning import prompt_opens_thinking

__all__ = ["Engine", "KVSnapshot"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Prompt tokens evaluated per llama_decode call on the CPU: small enough for steady progress
# events, large enough to keep prefill throughput (measured: 128 vs 512 within noise here).
CPU_PREFILL_CHUNK = 128
CLOSED = "the model was closed"  # what work asked of an engine after close() gets


class Engine:
    """A loaded model plus the exact token log of the conversation in its KV cache."""

    def __init__(self, model_path: Path, options: EngineOptions | None = None, name: str = "",
                 notices: Sequence[str] = ()) -> None:
        """``notices``: lines about the model file (it changed since it was imported), given to
        the first turn after each load, as the load's own are."""
        self.model_path = Path(model_path)
        self.options = options or EngineOptions()
        self.name = name or self.model_path.stem
        self.info: Loaded | None = None
        self.n_params: int | None = None  # from the GGUF header, once loaded (escalation reads it)
        self._preflight: Preflight | None = None
        self._runtime: LlamaRuntime | None = None
        self._prompts = ModelPrompts()  # the loaded model's chat template
        self._kv: ConversationCache | None = None
        self._speculator: Speculator | None = None
        self._vision = Vision()  # reads the images of messages that have some
        self._notices: list[Notice] = []  # for the next foreground turn (after a load)
        self._file_notices = [Notice(text, kind="model") for text in notices]
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._current: TurnHandle | None = None
        self._background_jobs: list[TurnHandle] = []
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._closed = False  # set by close(): the engine thread takes no more work
        self._thread = threading.Thread(target=self._serve, name="localchat-engine", daemon=True)
        self._thread.start()

    # -- public API (any thread) --------------------------------------------------------------

    def load(self, on_progress: Callable[[float], None] | None = None) -> Loaded:
        """Load the model on the engine thread; blocks the caller. Raises EngineError."""
        return self.call(lambda: self._load(on_progress))

    def preflight(self) -> Preflight:
        """Check, without loading weights, that the model can be loaded and chatted with
        (``localchat.engine.preflight``); the next ``load`` goes on with what it read. Raises
        ``EngineError``."""
        self._preflight = preflight(self.model_path, self.name, self.options)
        return self._preflight

    def submit(
        self, messages: list[dict[str, str]], sampling: Sampling | None = None, *,
        background: bool = False, pool: StatePool | None = None,
    ) -> TurnHandle:
        """Start a turn for ``messages`` (the whole conversation, newest user message last).

        A ``background`` turn (a summary, say) must only append to what the cache holds; when it
        ends, everything it added is removed again, and any later foreground turn stops it at
        once: the user's reply always wins.

        With a ``pool`` (a server answering many conversations) the turn first takes the state
        that keeps the most of ``messages``, the live one or a saved one (``state_pool``), and
        saves the live one there if it would lose part of it; the messages are laid out exactly,
        never by a trim shift (a client's own history is not this engine's to approximate).
        """
        handle = TurnHandle(on_stop=self._stop_handle)
        snapshot = [dict(m) for m in messages]
        with self._lock:
            if background:
                self._background_jobs.append(handle)
                self._idle.clear()
            else:
                waiting, self._background_jobs = self._background_jobs, []
        if not background:
            for pending in waiting:  # queued or running: stopped before it costs the user time
                pending.stop()
        self._queue_turn(handle, lambda: self._run_turn(handle, snapshot, sampling or Sampling(),
                                                        background, pool))
        return handle

    def submit_prompt(self, prompt: RawPrompt, sampling: Sampling, pool: StatePool | None = None) -> TurnHandle:
        """``submit`` for a prompt given as tokens, laid as they are (``layout.RawPrompt``)."""
        handle = TurnHandle(on_stop=self._stop_handle)
        turn = lambda: self._turn(handle, [], sampling, pool=pool, raw=prompt)  # noqa: E731
        self._queue_turn(handle, lambda: self._run_job(handle, turn, False))
        return handle

    def prepare(self, messages: list[dict[str, str]],
                tools: tuple[dict[str, Any], ...] = ()) -> TurnHandle:
        """In the background, bring the KV cache to hold exactly ``messages`` (no reply header):
        after a new system prompt or a summary placed before kept turns, the cells from that point
        on must be computed again, and this does it before the user's next message needs them.
        ``tools``: those the next turn will offer, rendered as that turn will render them (else
        the prompt laid down here is not the one it can reuse).
        Abortable: a foreground turn stops it at once and keeps what it had prefilled, which that
        turn then reuses. Done("stop") when the cache is ready, "aborted" when a turn came first."""
        handle = TurnHandle(on_stop=self._stop_handle)
        snapshot = [dict(m) for m in messages]
        sampling = Sampling(tools=tools) if tools else None
        with self._lock:
            self._background_jobs.append(handle)
            self._idle.clear()
        self._queue_turn(handle, lambda: self._run_job(handle, lambda: self._prepare(handle, snapshot, sampling), True))
        return handle

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no background turn (e.g. a summary) is queued or running."""
        return self._idle.wait(timeout)

    def stop(self) -> None:
        """Stop the running turn, if any, within one token."""
        with self._lock:
            current = self._current
        if current is not None:
            current.stop()

    def set_speculative(self, mode: str) -> str:
        """Switch speculative decoding for the next turns ("auto" | "ngram" | "draft" | "off",
        among what the load set up: a draft model is only there if one was configured and
        loaded). Returns what now drafts, in words (``speculation``)."""
        from localchat.settings import SPECULATIVE_MODES

        if mode not in SPECULATIVE_MODES:
            raise EngineError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, not {mode!r}")

        def job() -> str:
            speculator = self._require_speculator()
            speculator.mode = mode  # type: ignore[assignment]
            return speculator.describe()

        result: str = self.call(job)
        return result

    def check_costs(self, up_to: int) -> list[float]:
        """What checking 1..``up_to`` drafted tokens costs beyond a plain decode, in plain
        decodes, as this engine's drafting policy now reckons it (timed on this machine once
        it has drafted; its prior curve before)."""
        policy = self._require_speculator().policy
        return self.call(lambda: [policy.check_cost(k) for k in range(1, up_to + 1)])

    @property
    def speculation(self) -> str:
        """What drafts tokens for this model ("ngram + draft smollm2-135m", "off: why")."""
        return self._speculator.describe() if self._speculator is not None else "off"

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread after queued work; return its result or raise."""
        future: Future = Future()

        def job() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        if not self._queue(job):
            raise EngineError(CLOSED)
        return future.result()

    def _queue(self, job: Callable[[], None]) -> bool:
        """Queue ``job`` for the engine thread; False once ``close`` has begun (the thread will
        never run it, and whoever waits on it would wait for ever: a turn ending as the app quits
        saves its snapshot after the engine was closed)."""
        with self._lock:
            if self._closed:
                return False
            self._jobs.put(job)
            return True

    def _queue_turn(self, handle: TurnHandle, job: Callable[[], None]) -> None:
        """Queue a turn-like ``job``; once ``close`` has begun its handle ends at once, as a
        job that ran would have ended it (a background one no longer keeps the engine busy)."""
        if not self._queue(job):
            with self._lock:
                self._job_ended(handle)
            handle.emit(Failed(CLOSED))

    def _job_ended(self, handle: TurnHandle) -> None:
        """(Lock held.) ``handle`` no longer waits or runs; no background job left: idle."""
        if handle in self._background_jobs:
            self._background_jobs.remove(handle)
        if not self._background_jobs:
            self._idle.set()

    def check_grammar(self, grammar: str, root: str = "root") -> None:
        """FormatError unless llama.cpp parses ``grammar`` over this model's vocabulary (a token
        named by its text must be one of the model's)."""
        from localchat.engine.sampling.grammar import check_grammar

        self.call(lambda: check_grammar(grammar, root, self._require_runtime().vocab))

    def reset(self) -> None:
        """Empty the KV cache (the next turn prefills everything, as a stateless server would)."""
        self.call(lambda: self._require_kv().forget())

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    def tokenize(self, text: str) -> list[int]:
        """Tokens of plain text (no special tokens parsed, no BOS)."""
        return self._require_runtime().model.tokenize(text.encode("utf-8"), False, False)

    def detokenize(self, tokens: list[int]) -> str:
        return self._require_runtime().llama.detokenize(tokens).decode("utf-8", errors="replace")

    def template_overhead(self) -> int:
        """Template tokens around one user message plus the assistant header and the previous
        reply's end marker (measured once per model)."""
        return self._prompts.overhead(self._require_runtime().tokenize)

    def fresh_logits(self, messages: list[dict[str, str]], reply: list[int],
                     check_size: int | None = None, sampling: Sampling | None = None) -> Any:
        """Next-token logits (a numpy array) after prefilling ``messages`` and the reply tokens
        ``reply`` on an empty cache, as a fresh turn would (the cache is emptied afterwards).
        The exactness oracle's tool: where a cached reply and a fresh one differ, these logits
        tell a near-tie flipped by batch-shape rounding from a clear preference (a wrong cell).
        ``check_size``: the reply is evaluated in batches of that many tokens with logits at
        each, as speculative checks evaluate drafts (on the CPU, other kernels than one token at
        a time), instead of one token at a time. ``sampling``: the turn's, for its tools."""
        def job() -> Any:
            prompt = self._fresh_prompt(messages, sampling)
            return fresh_logits(self._require_kv(), prompt, reply, check_size, CPU_PREFILL_CHUNK)

        return self.call(job)

    def fresh_prompt(self, messages: list[dict[str, str]],
                     sampling: Sampling | None = None) -> list[int]:
        """The tokens a turn on an empty cache would prefill for ``messages`` (its rendered
        prompt, up to the assistant's header), with ``sampling``'s tools if it has some."""
        return self.call(lambda: self._fresh_prompt(messages, sampling))

    def _fresh_prompt(self, messages: list[dict[str, str]],
                      sampling: Sampling | None = None) -> list[int]:
        messages, tokenize = self._images(messages, self._require_kv())
        render, shaped = self._prompts.render_for(messages, sampling)
        return plan_layout([], shaped, render, tokenize).tokens

    def _images(self, messages: list[dict], kv: ConversationCache | None = None) -> tuple[list[dict], Any]:
        """``Vision.for_turn``: the pictures bound to ``kv`` for its prefill (None: counting)."""
        return self._vision.for_turn(messages, self._require_runtime().tokenize, self.name, kv)

    def end_tokens(self) -> list[int]:
        """The tokens that end a reply: where a greedy reply stops and another goes on, the
        oracle weighs the best of these against the token the longer one chose."""
        return self.call(lambda: self._require_runtime().end_of_generation_tokens())

    def prompt_tokens(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                      sampling: Sampling | None = None) -> int:
        """Exact length in tokens of ``messages`` as the template renders them (no cache effect),
        with ``sampling``'s tools if it has some."""
        messages, tokenize = self._images(messages)
        render, shaped = self._prompts.render_for(messages, sampling)
        return len(tokenize(render(shaped, add_generation_prompt), True))

    def close(self) -> None:
        if self._thread.is_alive():
            with self._lock:
                pending, self._background_jobs = self._background_jobs, []
                self._closed = True
                self._jobs.put(None)  # after every job queued so far, which still run
            for handle in pending:
                handle.stop()
            self.stop()
            self._thread.join(timeout=30)
        if self._speculator is not None:
            self._speculator.close()
            self._speculator = None
        self._vision.close()
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    # -- state the session's context policy reads (engine thread or after a turn) -----------

    @property
    def n_ctx(self) -> int:
        return self._require_runtime().n_ctx

    @property
    def n_vocab(self) -> int:
        return self._require_runtime().n_vocab

    @property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary(self._require_runtime())

    @property
    def memory_kind(self) -> str:
        """kv | swa | recurrent | hybrid: how the model's context memory behaves."""
        return self._require_runtime().memory_kind

    @property
    def can_trim_in_place(self) -> bool:
        """Whether dropping old turns keeps the later cells (a shift); otherwise a trim means
        prefilling the kept turns again (recurrent and hybrid memories)."""
        return self._require_runtime().can_shift

    @property
    def supports_thinking(self) -> bool:
        """Whether the model's template has a thinking switch (``Sampling.thinking`` on/off)."""
        return self._prompts.supports_thinking

    @property
    def tokens_in_context(self) -> int:
        return self._kv.n_tokens if self._kv is not None else 0

    def cached_messages(self) -> list[CachedMessage]:
        """What the KV cache holds, one record per message (a copy)."""
        return self._kv.copy_records() if self._kv is not None else []

    # -- KV snapshots (reopen a long session without prefilling it again) ---------------------

    def fingerprint(self) -> dict[str, Any]:
        """What a saved KV state depends on: the model file, context size, KV type, template and
        llama.cpp version. A snapshot taken under another fingerprint must not be restored."""
        return engine_fingerprint(self.model_path, self._require_runtime().n_ctx,
                                  self.options.kv_type, self._prompts.template, self._vision.path)

    def export_snapshot(self) -> KVSnapshot:
        """The KV cells and exact token records of the conversation (engine thread; fast: a copy)."""
        return self.call(lambda: self._require_kv().export())

    def import_snapshot(self, snapshot: KVSnapshot) -> float:
        """Restore a snapshot taken with the same fingerprint; returns the ms it took.
        Raises EngineError (and leaves an empty cache) if llama.cpp rejects the data or it does
        not hold the tokens its records say."""
        return self.call(lambda: self._require_kv().restore(snapshot))

    # -- engine thread -------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def _require_runtime(self) -> LlamaRuntime:
        if self._runtime is None:
            raise EngineError("no model is loaded")
        return self._runtime

    def _require_speculator(self) -> Speculator:
        if self._speculator is None:
            raise EngineError("no model is loaded")
        return self._speculator

    def _require_kv(self) -> ConversationCache:
        if self._kv is None:
            raise EngineError("no model is loaded")
        return self._kv

    def _load(self, on_progress: Callable[[float], None] | None) -> Loaded:
        checked, self._preflight = self._preflight or self.preflight(), None  # a later load reads again
        self.n_params = checked.n_params
        loaded = load_model(self.model_path, self.options, self.name, checked, on_progress)
        self._runtime, self._prompts = loaded.runtime, loaded.prompts
        self._kv = ConversationCache(self._runtime, self.options.checkpoints)
        self._speculator, self._vision = loaded.speculator, loaded.vision
        self._notices = [*self._file_notices, *(Notice(t, kind="speculative") for t in loaded.notices)]
        self.info = loaded.info
        return self.info

    def _stop_handle(self, handle: TurnHandle) -> None:
        with self._lock:
            if handle is self._current and self._runtime is not None:
                self._runtime.request_abort()
                if self._speculator is not None:
                    self._speculator.request_abort()

    def _run_turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling,
                  background: bool = False, pool: StatePool | None = None) -> None:
        if background:
            self._run_job(handle, lambda: self._background_turn(handle, messages, sampling), True)
        else:
            self._run_job(handle, lambda: self._foreground_turn(handle, messages, sampling, pool),
                          False)

    def _foreground_turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling,
                         pool: StatePool | None = None, kv: ConversationCache | None = None) -> None:
        """A user's turn: first what the load could not set up (one line each), then the turn."""
        notices, self._notices = self._notices, []
        for notice in notices:
            handle.emit(notice)
        self._turn(handle, messages, sampling, pool=pool, kv=kv)

    def _run_job(self, handle: TurnHandle, body: Callable[[], None], background: bool,
                 kv: ConversationCache | None = None) -> None:
        """Run one turn-like job on ``kv`` (the engine's own cache, or a slot's); it always ends
        its handle with Done or Failed."""
        kv = kv or self._kv
        self._begin_job(handle)
        try:
            if handle.stop_requested:
                handle.emit(Done("", "aborted", self._timings(Timings(), kv)))
                return
            body()
        except UserError as exc:
            if not background and kv is not None and not isinstance(exc, ContextOverflow):
                kv.forget()  # a background job put the cache back; an overflow changed nothing
            handle.emit(Failed(str(exc), code=getattr(exc, "code", "")))
        except Exception as exc:  # an engine bug must still end the turn for the UI
            if not background and kv is not None:
                kv.forget()
            where = logs.attach()
            log.exception("a turn failed on the engine thread")
            details = f" (traceback in {where})" if where is not None else ""
            handle.emit(Failed(f"engine error: {type(exc).__name__}: {exc}{details}"))
        finally:
            self._end_job(handle)

    def _begin_job(self, handle: TurnHandle) -> None:
        with self._lock:
            self._current = handle
            if self._runtime is not None:
                self._runtime.clear_abort()
            if self._speculator is not None:
                self._speculator.clear_abort()

    def _end_job(self, handle: TurnHandle) -> None:
        with self._lock:
            self._current = None
            self._job_ended(handle)

    def _prepare(self, handle: TurnHandle, messages: list[dict], sampling: Sampling | None) -> None:
        kv = self._require_kv()
        runtime = kv.runtime
        clock = TurnClock(handle.submitted_at)
        timings = Timings(model=self.name)
        messages, tokenize = self._images(messages, kv)
        render, shaped = self._prompts.render_for(messages, sampling)
        layout = plan_layout(kv.records, shaped, render, tokenize,
                             allow_shift=runtime.can_shift, add_generation_prompt=False)
        last = kv.records[-1] if kv.records else None
        if (last is not None and last.open and layout.messages
                and layout.messages[-1].matches({"role": last.role, "content": last.content})
                and layout.messages[-1].tokens[:len(last.tokens)] == last.tokens):
            # The reply's end marker is left for the next turn to add (as after any reply).
            layout.messages[-1] = last
        self._check_fits(layout.tokens)
        clock.prefill_start()
        finished = self._fill(handle, layout, timings, needs_logits=False)
        clock.prefill_end()
        handle.emit(Done("", "stop" if finished else "aborted", self._timings(clock.fill(timings))))

    def _background_turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling) -> None:
        """Run a turn on top of the conversation, then put the cache back exactly as it was."""
        kv = self._require_kv()
        kv.drop_partial()  # a stopped draft's cells: not this turn's base
        saved, saved_tokens = kv.mark(), kv.tokens()
        shaped_messages, tokenize = self._images(messages, kv)
        render, shaped = self._prompts.render_for(shaped_messages, sampling)
        layout = plan_layout(saved.records, shaped, render, tokenize, allow_shift=False)
        if layout.prefix_fallback or layout.tokens[:len(saved_tokens)] != saved_tokens:
            raise EngineError("a background turn may only add to the conversation")
        try:
            self._turn(handle, messages, sampling, layout)
        finally:
            kv.put_back(saved)

    def _turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling,
              layout: Layout | None = None, pool: StatePool | None = None,
              raw: RawPrompt | None = None, kv: ConversationCache | None = None) -> None:
        kv = kv or self._require_kv()
        runtime = kv.runtime
        clock = TurnClock(handle.submitted_at)
        timings = Timings(model=self.name)
        messages, tokenize = self._images(messages, kv)
        try:  # before anything is prefilled: a grammar llama.cpp refuses ends the turn at once
            tools = self._prompts.tool_plan(messages, sampling)
            if layout is None:
                wanted = raw or self._prompts.chat_prompt(messages, sampling, tools)
                if pool is not None:
                    timings.restore_ms = kv.take_best_state(pool, wanted)
                layout = wanted.layout() if isinstance(wanted, RawPrompt) else wanted.layout_over(
                    kv.records, tokenize, allow_shift=runtime.can_shift and pool is None)
            self._check_fits(layout.tokens)
            inside = prompt_opens_thinking(layout.messages[-1].text)
            constraint = TurnConstraint.for_turn(
                self._require_runtime(),
                sampling.constraint or (tools.constraint if tools is not None else None),
                sampling, inside)
        except FormatError as exc:
            handle.emit(Failed(str(exc), code=exc.code))
            return
        try:
            clock.prefill_start()
            finished = self._fill(handle, layout, timings, kv=kv)
            clock.prefill_end()
            if not finished:
                handle.emit(Done("", "aborted", self._timings(clock.fill(timings), kv)))
                return

            # Reasoning streams as Thinking events, the answer as Tokens; the reply keeps both.
            stream = ReplyEvents(handle, clock, inside=inside, verbatim=bool(raw and raw.verbatim),
                                 calls=tools.splitter() if tools is not None else None)
            confidence_tokens = self.options.confidence_tokens if self.options.track_confidence else 0
            drafts = self._require_speculator().for_turn(sampling)
            reply, finish = kv.generate(sampling, confidence_tokens, lambda: handle.stop_requested,
                                        stream.token, drafts, constraint)
        finally:
            if constraint is not None:
                constraint.close()
        if drafts is not None:
            timings.draft_n, timings.draft_n_accepted = drafts.draft_n, drafts.draft_n_accepted
        if constraint is not None:
            counts = constraint.counts
            timings.constrained_n, timings.redrawn_n = counts.judged, counts.redrawn
            timings.vocab_passes = counts.vocab_passes
        thinking = stream.finish()
        handle.emit(Done(reply, finish, self._timings(clock.fill(timings), kv), thinking,
                         stream.calls))

    def _check_fits(self, tokens: list[int]) -> None:
        n_ctx = self._require_runtime().n_ctx
        if len(tokens) >= n_ctx:
            raise ContextOverflow(len(tokens), n_ctx, count_image_tokens(tokens))

    def _fill(self, handle: TurnHandle, layout: Layout, timings: Timings,
              needs_logits: bool = True, kv: ConversationCache | None = None) -> bool:
        """``reuse.fill_cache`` for this turn (see there); False if a stop request ended it."""
        runtime = self._require_runtime()
        chunk = runtime.n_batch if self.info and self.info.gpu_layers else CPU_PREFILL_CHUNK
        return fill_cache(kv or self._require_kv(), layout, timings, chunk=min(chunk, self._chunk_cap),
                          should_stop=lambda: handle.stop_requested,
                          on_progress=lambda done, total: handle.emit(PrefillProgress(done, total)),
                          needs_logits=needs_logits)

    def _timings(self, timings: Timings, kv: ConversationCache | None = None) -> Timings:
        runtime, kv = self._runtime, kv or self._kv
        timings.n_ctx = runtime.n_ctx if runtime else 0
        timings.n_ctx_used = kv.n_tokens if kv is not None else 0
        timings.approx_n = kv.approx_n if kv is not None else 0
        return timings

    @property
    def _chunk_cap(self) -> int:
        """The most prompt tokens one decode evaluates (parallel slots take a share)."""
        return self._require_runtime().n_batch

    # -- measuring (``localchat bench``) -------------------------------------------------------

    def with_cache(self, fn: Callable[[ConversationCache], T]) -> T:
        """``fn(cache)`` on the engine thread after queued work, its result returned (or its
        exception raised): for measurements that drive llama.cpp directly at the conversation's
        own state (``bench.decode``'s bare loop). ``fn`` must leave the cells and their record
        as it found them."""
        result: T = self.call(lambda: fn(self._require_kv()))
        return result

