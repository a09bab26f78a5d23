"""The engine: one thread owns the llama.cpp model and runs turns, one at a time.

Callers (TUI, ``ask``, ``bench``, the chat session) submit a turn and read typed events from the
returned TurnHandle; nothing they do blocks the engine, and the engine never calls back into them.
The engine keeps an exact record of what the KV cache holds (see layout.py), so each turn prefills
only what is new, a stop ends decoding within one token, and trimming moves cached tokens instead
of evaluating them again.
"""

from __future__ import annotations

import codecs
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from localchat.engine.layout import CachedMessage, Layout, plan_layout
from localchat.engine.options import EngineOptions, Sampling
from localchat.engine.runtime import DecodeAborted, LlamaRuntime, token_probability
from localchat.engine.templates import choose_template, make_renderer
from localchat.engine.turn import TurnClock, TurnHandle
from localchat.errors import EngineError, UserError
from localchat.events import Done, Failed, Loaded, PrefillProgress, Timings, Token

@dataclass
class KVSnapshot:
    """A conversation's KV cache: the per-message token records and llama.cpp's sequence state."""

    records: list[CachedMessage]
    state: bytes

    @property
    def n_tokens(self) -> int:
        return sum(len(m.tokens) for m in self.records)


# Prompt tokens evaluated per llama_decode call on the CPU: small enough for steady progress
# events, large enough to keep prefill throughput (measured: 128 vs 512 within noise here).
CPU_PREFILL_CHUNK = 128


class Engine:
    """A loaded model plus the exact token log of the conversation in its KV cache."""

    def __init__(self, model_path: Path, options: EngineOptions | None = None, name: str = "") -> None:
        self.model_path = Path(model_path)
        self.options = options or EngineOptions()
        self.name = name or self.model_path.stem
        self.info: Loaded | None = None
        self._runtime: LlamaRuntime | None = None
        self._render = None
        self._template = ""
        self._overhead: int | None = None
        self._cache: list[CachedMessage] = []
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._current: TurnHandle | None = None
        self._background: TurnHandle | None = None
        self._background_jobs: list[TurnHandle] = []
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="localchat-engine", daemon=True)
        self._thread.start()

    # -- public API (any thread) --------------------------------------------------------------

    def load(self, on_progress: Callable[[float], None] | None = None) -> Loaded:
        """Load the model on the engine thread; blocks the caller. Raises EngineError."""
        return self.call(lambda: self._load(on_progress))

    def submit(
        self, messages: list[dict[str, str]], sampling: Sampling | None = None, *, background: bool = False
    ) -> TurnHandle:
        """Start a turn for ``messages`` (the whole conversation, newest user message last).

        A ``background`` turn (a summary, say) must only append to what the cache holds; when it
        ends, everything it added is removed again, and any later foreground turn stops it at
        once: the user's reply always wins.
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
        self._jobs.put(lambda: self._run_turn(handle, snapshot, sampling or Sampling(), background))
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

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread after queued work; return its result or raise."""
        future: Future = Future()

        def job() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        self._jobs.put(job)
        return future.result()

    def reset(self) -> None:
        """Empty the KV cache (the next turn prefills everything, as a stateless server would)."""
        def clear() -> None:
            self._require_runtime().clear()
            self._cache = []

        self.call(clear)

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
        if self._overhead is None:
            runtime = self._require_runtime()
            probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            before = self._render(probe, False)
            after = self._render(probe + [{"role": "user", "content": "z"}], True)
            delta = after[len(before):] if after.startswith(before) else after
            self._overhead = max(1, len(runtime.tokenize(delta, False)) - 1) + 2
        return self._overhead

    def close(self) -> None:
        if self._thread.is_alive():
            with self._lock:
                pending, self._background_jobs = self._background_jobs, []
            for handle in pending:
                handle.stop()
            self.stop()
            self._jobs.put(None)
            self._thread.join(timeout=30)
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    # -- state the session's context policy reads (engine thread or after a turn) -----------

    @property
    def n_ctx(self) -> int:
        return self._require_runtime().n_ctx

    @property
    def tokens_in_context(self) -> int:
        return sum(len(m.tokens) for m in self._cache)

    def cached_messages(self) -> list[CachedMessage]:
        """What the KV cache holds, one record per message (a copy)."""
        return [CachedMessage(m.role, m.content, m.text, list(m.tokens), m.open) for m in self._cache]

    def render_tokens(self, messages: list[dict[str, str]]) -> int:
        """Tokens the prompt for ``messages`` (with the assistant header) takes."""
        render = self._render
        runtime = self._require_runtime()
        return len(runtime.tokenize(render(messages, True), True))

    # -- KV snapshots (reopen a long session without prefilling it again) ---------------------

    def fingerprint(self) -> dict[str, Any]:
        """What a saved KV state depends on: the model file, context size, KV type, template and
        llama.cpp version. A snapshot taken under another fingerprint must not be restored."""
        import hashlib

        import llama_cpp

        stat = self.model_path.stat()
        runtime = self._require_runtime()
        return {
            "model_file": self.model_path.name,
            "model_size": stat.st_size,
            "model_mtime_ns": stat.st_mtime_ns,
            "n_ctx": runtime.n_ctx,
            "kv_type": self.options.kv_type,
            "llama_cpp": getattr(llama_cpp, "__version__", "?"),
            "template": hashlib.sha256(self._template.encode()).hexdigest()[:16],
        }

    def export_snapshot(self) -> KVSnapshot:
        """The KV cells and exact token records of the conversation (engine thread; fast: a copy)."""
        def export() -> KVSnapshot:
            runtime = self._require_runtime()
            return KVSnapshot(self.cached_messages(), runtime.export_sequence())

        return self.call(export)

    def import_snapshot(self, snapshot: KVSnapshot) -> float:
        """Restore a snapshot taken with the same fingerprint; returns the ms it took.
        Raises EngineError (and leaves an empty cache) if llama.cpp rejects the data or it does
        not hold the tokens its records say."""
        def restore() -> float:
            started = time.perf_counter()
            runtime = self._require_runtime()
            expected = sum(len(m.tokens) for m in snapshot.records)
            if not runtime.import_sequence(snapshot.state) or runtime.max_position() + 1 != expected:
                self._forget_cache()
                raise EngineError("the saved context does not match this model; it will be rebuilt")
            self._cache = [CachedMessage(m.role, m.content, m.text, list(m.tokens), m.open)
                           for m in snapshot.records]
            return (time.perf_counter() - started) * 1000.0

        return self.call(restore)

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

    def _load(self, on_progress: Callable[[float], None] | None) -> Loaded:
        from localchat.engine.offload import resolve_gpu_layers
        from localchat.models.gguf import read_gguf

        started = time.perf_counter()
        if on_progress:
            on_progress(0.0)
        if not self.model_path.is_file():
            raise EngineError(f"model file not found: {self.model_path}")
        gguf = read_gguf(self.model_path)
        template = choose_template(self.name, gguf.chat_template, self.options.chat_template,
                                   self.options.chat_format)
        if gguf.context_length and self.options.n_ctx > gguf.context_length:
            self.options.n_ctx = gguf.context_length  # more would only degrade the model
        fit = resolve_gpu_layers(self.options.gpu_layers, gguf, self.options)
        if on_progress:
            on_progress(0.1)
        self._runtime = LlamaRuntime(self.model_path, self.options, fit.n_gpu_layers)
        self._render = make_renderer(template, self._runtime.bos_text, self._runtime.eos_text)
        self._template = template
        self._cache = []
        if on_progress:
            on_progress(1.0)
        self.info = Loaded(
            model=self.name,
            n_ctx=self._runtime.n_ctx,
            gpu_layers=fit.offloaded_layers,
            n_layers=fit.n_layers,
            backend=fit.backend,
            load_ms=(time.perf_counter() - started) * 1000.0,
        )
        return self.info

    def _stop_handle(self, handle: TurnHandle) -> None:
        with self._lock:
            if handle is self._current and self._runtime is not None:
                self._runtime.request_abort()

    def _run_turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling,
                  background: bool = False) -> None:
        with self._lock:
            self._current = handle
            self._background = handle if background else None
            if self._runtime is not None:
                self._runtime.clear_abort()
        try:
            if handle.stop_requested:
                handle.emit(Done("", "aborted", self._timings(Timings())))
                return
            if background:
                self._background_turn(handle, messages, sampling)
            else:
                self._turn(handle, messages, sampling)
        except UserError as exc:
            if not background:  # a background turn has already put the cache back
                self._forget_cache()
            handle.emit(Failed(str(exc)))
        except Exception as exc:  # an engine bug must still end the turn for the UI
            if not background:
                self._forget_cache()
            handle.emit(Failed(f"engine error: {type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self._current = None
                self._background = None
                if handle in self._background_jobs:
                    self._background_jobs.remove(handle)
                if not self._background_jobs:
                    self._idle.set()

    def _background_turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling) -> None:
        """Run a turn on top of the conversation, then put the cache back exactly as it was."""
        runtime = self._require_runtime()
        saved, saved_n = self._cache, self.tokens_in_context
        layout = plan_layout(self._cache, messages, self._render, runtime.tokenize, allow_shift=False)
        if layout.prefix_fallback or layout.tokens[:saved_n] != [t for m in saved for t in m.tokens]:
            raise EngineError("a background turn may only add to the conversation")
        try:
            self._turn(handle, messages, sampling, layout)
        finally:
            runtime.remove(saved_n, -1)
            self._cache = saved

    def _turn(self, handle: TurnHandle, messages: list[dict], sampling: Sampling,
              layout: Layout | None = None) -> None:
        runtime = self._require_runtime()
        clock = TurnClock(handle.submitted_at)
        timings = Timings(model=self.name)
        if layout is None:
            layout = plan_layout(self._cache, messages, self._render, runtime.tokenize,
                                 allow_shift=runtime.can_shift)
        timings.prefix_fallback = layout.prefix_fallback
        target = layout.tokens
        if len(target) >= runtime.n_ctx:
            raise EngineError(
                f"the conversation needs {len(target)} tokens but the context holds {runtime.n_ctx}; "
                "start a new chat or raise n_ctx"
            )
        clock.prefill_start()
        current = self._apply_shift(layout, timings)
        reused = _common_prefix(current, target)
        if reused == len(target):
            reused -= 1  # the last prompt token must be evaluated to get logits to sample from
        runtime.remove(reused, -1)
        timings.cache_n = reused
        pending = target[reused:]
        timings.prompt_n += len(pending)
        # If this turn only appends, a stopped prefill can put the cache back exactly as it was.
        before, before_n = self._cache, sum(len(m.tokens) for m in self._cache)
        only_appends = layout.shift is None and reused >= before_n
        self._cache = layout.messages
        try:
            self._prefill(handle, pending, reused)
        except DecodeAborted:
            if only_appends:
                runtime.remove(before_n, -1)
                self._cache = before
            else:
                self._keep_whole_messages(runtime.max_position() + 1)
            clock.prefill_end()
            handle.emit(Done("", "aborted", self._timings(clock.fill(timings))))
            return
        clock.prefill_end()
        reply, finish = self._generate(handle, sampling, clock)
        handle.emit(Done(reply, finish, self._timings(clock.fill(timings))))

    def _apply_shift(self, layout: Layout, timings: Timings) -> list[int]:
        """Drop trimmed turns by moving later cache cells down; return the tokens now cached."""
        runtime = self._require_runtime()
        current = [t for m in self._cache for t in m.tokens]
        shift = layout.shift
        if shift is None:
            return current
        end = len(current)
        runtime.remove(shift.start, shift.end)
        if shift.insert:
            # llama.cpp only accepts a batch that continues a sequence (Y = X + 1), so the new
            # summary is evaluated at the end and then rotated into the gap: park it far out,
            # move the kept turns, bring it back. Each move is a RoPE shift of cached keys.
            size = len(shift.insert)
            for i in range(0, size, runtime.n_batch):
                runtime.decode(shift.insert[i:i + runtime.n_batch], end + i)
            parked = end + size + runtime.n_ctx
            runtime.move(end, end + size, parked - end)
            runtime.move(shift.end, end, shift.delta)
            runtime.move(parked, parked + size, shift.start - parked)
        elif shift.delta:
            runtime.move(shift.end, -1, shift.delta)
        timings.trimmed_n = shift.end - shift.start
        timings.context_shift = True
        timings.prompt_n += len(shift.insert)
        return current[:shift.start] + shift.insert + current[shift.end:]

    def _prefill(self, handle: TurnHandle, tokens: list[int], start: int) -> None:
        runtime = self._require_runtime()
        chunk = runtime.n_batch if self.info and self.info.gpu_layers else CPU_PREFILL_CHUNK
        chunk = min(chunk, runtime.n_batch)
        for i in range(0, len(tokens), chunk):
            if handle.stop_requested:
                raise DecodeAborted
            runtime.decode(tokens[i:i + chunk], start + i, abortable=True)
            handle.emit(PrefillProgress(min(i + chunk, len(tokens)), len(tokens)))

    def _generate(self, handle: TurnHandle, sampling: Sampling, clock: TurnClock) -> tuple[str, str]:
        runtime = self._require_runtime()
        reply_record = self._cache[-1]
        position = self.tokens_in_context
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sampled: list[bytes] = []
        evaluated_bytes = 0
        track = self.options.track_confidence
        sampler = runtime.new_sampler(sampling)
        finish = "length"
        try:
            while True:
                token = sampler.sample(runtime.ctx)
                if runtime.is_end_of_generation(token):
                    finish = "stop"
                    break
                prob = token_probability(runtime.last_logits(), token) if track else None
                piece = runtime.piece(token)
                sampled.append(piece)
                text = decoder.decode(piece)
                clock.token(bool(text))
                handle.emit(Token(text, token, prob))
                if len(sampled) >= sampling.max_tokens or position + 1 >= runtime.n_ctx:
                    break  # the last sampled token is not evaluated; the next turn adds it
                if handle.stop_requested:
                    finish = "aborted"
                    break
                try:
                    runtime.decode([token], position)
                except DecodeAborted:  # defensive: the callback is not armed while decoding
                    finish = "aborted"
                    break
                reply_record.tokens.append(token)
                evaluated_bytes += len(piece)
                position += 1
        finally:
            sampler.close()
        reply_bytes = b"".join(sampled)
        reply = reply_bytes.decode("utf-8", errors="replace")
        reply_record.content = reply
        reply_record.text += reply_bytes[:evaluated_bytes].decode("utf-8", errors="replace")
        return reply, finish

    def _forget_cache(self) -> None:
        """After a failed turn the record may not match the KV cache: start clean, never wrong."""
        self._cache = []
        if self._runtime is not None:
            self._runtime.clear()

    def _keep_whole_messages(self, n_cached: int) -> None:
        """After an aborted prefill keep only messages whose tokens all made it into the cache."""
        kept, total = [], 0
        for record in self._cache:
            if total + len(record.tokens) > n_cached or record.open:
                break
            kept.append(record)
            total += len(record.tokens)
        self._require_runtime().remove(total, -1)
        self._cache = kept

    def _timings(self, timings: Timings) -> Timings:
        runtime = self._runtime
        timings.n_ctx = runtime.n_ctx if runtime else 0
        timings.n_ctx_used = self.tokens_in_context
        return timings


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
