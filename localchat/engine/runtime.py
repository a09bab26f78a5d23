"""The llama.cpp calls the engine needs, in one place: load, tokenize, decode at given positions,
the logits and a turn's sampler over them (``engine.sampling``), KV-cache edits and aborting a
decode. llama.cpp's log is kept away from the terminal by ``engine.llama_log``.

Only the engine thread calls these (``tokenize`` is also safe from other threads: it only reads
the vocabulary). Nothing here knows about chats or turns.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from localchat.engine import llama_log
from localchat.engine.options import EngineOptions, Sampling
from localchat.engine.sampling.sampler import Sampler, TokenJudge
from localchat.engine.threads import ThreadGovernor
from localchat.errors import EngineError

T = TypeVar("T")

_KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # GGML_TYPE_* values
# llama.cpp allocates contexts in steps of 256 tokens (n_ctx 40 becomes 256, 300 becomes 512),
# while keeping the batch at the requested size. Asking for less than one step is refused
# (factory, ask) rather than silently given 256.
MIN_N_CTX = 256


def check_n_ctx_floor(n_ctx: int, name: str = "n_ctx", *, zero_is_default: bool = False) -> None:
    """EngineError for a context size below llama.cpp's smallest allocation (``name`` is how the
    user gave it: a flag or a setting; ``zero_is_default``: 0 stands for the model's default)."""
    if n_ctx < MIN_N_CTX and not (zero_is_default and n_ctx == 0):
        raise EngineError(f"{name} {n_ctx} is too small: llama.cpp allocates at least {MIN_N_CTX} "
                          "tokens, so ask for at least that")


def physical_cores() -> int:
    """Physical CPU cores (Linux: distinct core ids in /proc/cpuinfo), else logical CPUs."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return max(1, os.cpu_count() or 1)
    cores, physical = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            cores.add((physical, value.strip()))
    return max(1, len(cores) or os.cpu_count() or 1)


MemoryKind = str  # "kv" | "swa" | "recurrent" | "hybrid"


def memory_kind(recurrent: bool, hybrid: bool, n_swa: int) -> MemoryKind:
    """How a model's context memory behaves: ``kv`` (attention cells, any of them removable),
    ``swa`` (sliding-window attention on some layers), ``recurrent`` (one state that folds in
    every token: no partial removal), ``hybrid`` (attention layers plus a recurrent state)."""
    if hybrid:
        return "hybrid"
    if recurrent:
        return "recurrent"
    return "swa" if n_swa > 0 else "kv"


class DecodeAborted(Exception):
    """llama_decode stopped mid-graph because a stop was requested."""


class KVFull(EngineError):
    """The cache has no free cells for a batch (nothing of it was kept)."""


@dataclass(frozen=True)
class BatchPart:
    """One sequence's share of a decode: ``tokens`` at positions ``start``.., logits after the
    last ``outputs`` of them."""

    seq: int
    tokens: list[int]
    start: int
    outputs: int = 1


class LlamaRuntime:
    """One loaded model and its context. Sequence ``seq`` (0) holds the conversation; a context
    made for ``options.parallel`` sequences gives each its own ``n_ctx`` cells (``engine.slots``:
    each slot sees this runtime through a view bound to its own sequence)."""

    def __init__(self, model_path: Path, options: EngineOptions, n_gpu_layers: int) -> None:
        import llama_cpp

        self._lib = llama_cpp
        kv_type = _KV_TYPES.get(options.kv_type)
        if kv_type is None:
            raise EngineError(f"unknown kv_type {options.kv_type!r}; use one of {', '.join(_KV_TYPES)}")
        # One thread per physical core, as llama.cpp does: measured here, 2 threads decode in
        # ~12 ms/token where 1 takes ~20; hyperthread siblings add nothing but barrier waits.
        threads = options.n_threads or physical_cores()
        self.seq = 0
        self.n_seq = max(1, options.parallel)
        llama_log.start_load()
        try:
            with llama_log.quiet_stderr():
                self.llama = _new_llama(
                    llama_cpp,
                    str(model_path),
                    n_ctx=options.n_ctx * self.n_seq,
                    n_batch=options.n_batch,
                    n_ubatch=min(options.n_ubatch, options.n_batch),
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=n_gpu_layers,
                    flash_attn=options.flash_attn,
                    type_k=kv_type,
                    type_v=kv_type,
                    swa_full=options.swa_full,
                    verbose=False,
                    n_seq_max=self.n_seq,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(llama_log.load_failure(model_path, exc)) from None
        # llama.cpp's own account of memory: {"model"|"kv"|"compute"|"output": {device: MiB}}.
        self.buffer_mib = llama_log.buffer_mib()
        self.ctx = self.llama._ctx.ctx
        self.model = self.llama._model
        self.vocab = self.model.vocab
        # Cells of one sequence (each has its own stream of the cache: see _context_defaults).
        self.n_ctx = (int(llama_cpp.llama_n_ctx_seq(self.ctx)) if self.n_seq > 1
                      else self.llama.n_ctx())
        self.n_vocab = self.model.n_vocab()
        # llama.cpp may lower the batch (to n_ctx for a small context); a decode call with more
        # tokens than the context's own n_batch aborts the process (GGML_ASSERT), so ask it.
        self.n_batch = min(options.n_batch, int(llama_cpp.llama_n_batch(self.ctx)))
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        self._batch_threads = threads
        self.governor = ThreadGovernor(threads, self.set_threads)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._logits_view: np.ndarray | None = None
        self._logits_address: int | None = None
        self._abort_requested = threading.Event()
        # Kept as an attribute: ctypes must not garbage-collect a callback llama.cpp holds.
        # What the armed callback asks (a batch of several sequences asks its own stop flag).
        self.abort_check = self._abort_requested.is_set
        self._abort_callback = llama_cpp.ggml_abort_callback(lambda _: self.abort_check())
        self._no_callback = llama_cpp.ggml_abort_callback()
        model = self.model.model
        self.n_swa = int(llama_cpp.llama_model_n_swa(model))
        self.swa_full = options.swa_full
        self.memory_kind = memory_kind(bool(llama_cpp.llama_model_is_recurrent(model)),
                                       bool(llama_cpp.llama_model_is_hybrid(model)), self.n_swa)
        # A recurrent state holds all of its history in one cell: nothing can be removed from
        # its middle or end, and moving positions means nothing. So such models never shift,
        # and rolling back goes through checkpoints (kv.py).
        self.can_shift = (bool(llama_cpp.llama_memory_can_shift(self._memory))
                          and not self.needs_checkpoints)
        # Whether a decode of several tokens gives each the logits a decode of one would, bit
        # for bit (measured on this CPU build: only flash attention on one thread does; without
        # it the attention kernels for several query tokens round differently, and with more
        # threads one token's attention is split over chunks of the cache). GPU kernels differ.
        self.exact_checks = options.flash_attn and threads == 1 and n_gpu_layers == 0
        self.bos_id = self.model.token_bos()
        self.add_bos = self.model.add_bos_token()
        self.bos_text = self._special_text(self.bos_id)
        self.eos_text = self._special_text(self.model.token_eos())
        self._pieces: dict[int, bytes] = {}
        self.text_tokens: list[int] = []  # special tokens shown as their text (show_as_text)
        self._end_of_generation: dict[int, bool] = {}

    @property
    def needs_checkpoints(self) -> bool:
        """Whether removing the end of the conversation can fail (see ``remove``), so rolling
        back needs saved states."""
        return self.memory_kind in ("recurrent", "hybrid") or (
            self.memory_kind == "swa" and not self.swa_full)

    # -- vocabulary ---------------------------------------------------------------------------

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.model.token_get_text(token)

    def tokenize(self, text: str, at_start: bool) -> list[int]:
        """Tokenize prompt text; special tokens written in the text become special tokens."""
        add_bos = at_start and self.add_bos and not (self.bos_text and text.startswith(self.bos_text))
        return self.model.tokenize(text.encode("utf-8"), add_bos, True)

    def fim_token(self, kind: str) -> int:
        """llama.cpp's fill-in-the-middle token of ``kind`` (pre, suf, mid, pad, rep, sep), as it
        read it from the GGUF or found it by its text; -1: the model has none."""
        return int(getattr(self._lib, f"llama_vocab_fim_{kind}")(self.vocab))

    # Both looked up in llama.cpp once per token id: right after a decode has flushed the CPU
    # caches, a ctypes call with its buffer took ~20-50 us a token, a dict lookup ~1.

    def piece(self, token: int) -> bytes:
        """The bytes a sampled token adds to the reply (control tokens add none)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._token_to_piece(token)
        return piece

    def show_as_text(self, texts: Iterable[str]) -> None:
        """Sampled special tokens with these texts add their text to the reply instead of nothing
        (a family's tool call marker, ``<|python_tag|>`` or ``[TOOL_CALLS]``: the call parser
        must see it, and the history renders it back to the same token)."""
        for text in texts:
            ids = self.model.tokenize(text.encode("utf-8"), False, True)
            if len(ids) == 1 and ids[0] not in self.text_tokens:
                self._pieces[ids[0]] = text.encode("utf-8")
                self.text_tokens.append(ids[0])

    def is_end_of_generation(self, token: int) -> bool:
        end = self._end_of_generation.get(token)
        if end is None:
            end = self._end_of_generation[token] = bool(self._lib.llama_vocab_is_eog(self.vocab, token))
        return end

    def _token_to_piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def end_of_generation_tokens(self) -> list[int]:
        """Every token that ends a reply (a pass over the vocabulary: for measuring, not per
        token)."""
        return [t for t in range(self.n_vocab) if self.is_end_of_generation(t)]

    # -- decoding -----------------------------------------------------------------------------

    def decode(self, tokens: list[int], start_pos: int, abortable: bool = False,
               outputs: int = 1) -> None:
        """Evaluate ``tokens`` at positions start_pos.. in the sequence (one llama_decode call),
        with logits after each of the last ``outputs`` of them (``logits_at(i)``: after the
        batch's i-th token; a speculative check asks for every drafted position, never for the
        whole context, which ``logits_all`` would).

        With ``abortable`` the abort callback is armed, so a long batch can be stopped mid-graph
        (CPU and Metal backends; CUDA runs asynchronously and finishes the batch). Armed only for
        prefill: llama.cpp calls it for every graph node, which would tax each decoded token.
        """
        self.decode_parts([BatchPart(self.seq, tokens, start_pos, outputs)], abortable)

    def drive(self, steps: Generator[BatchPart, None, T]) -> T:
        """Run a generation (``ConversationCache.generate``'s) whose decodes ``steps`` yields:
        each here, at once, then on with it (a decode's error is raised where it yielded);
        what it returns. A parallel slot's view has the engine thread step it with the other
        slots' (``SlotRuntime.drive``)."""
        try:
            part = next(steps)
            while True:
                try:
                    self.decode(part.tokens, part.start, outputs=part.outputs)
                except BaseException as exc:  # raised in the generation, which may go on
                    part = steps.throw(exc)
                    continue
                part = steps.send(None)
        except StopIteration as done:
            return done.value

    def decode_parts(self, parts: Sequence[BatchPart], abortable: bool = False) -> list[int]:
        """``decode`` for several sequences at once (``engine.slots``): one llama_decode call
        over every part; returns the batch index of each part's first token. A failure removes
        every part's new cells: DecodeAborted (stopped), KVFull (no cells left), EngineError."""
        total = sum(len(part.tokens) for part in parts)
        assert 0 < total <= self.n_batch
        batch = self._batch
        batch.n_tokens = total
        rows, i = [], 0
        for part in parts:
            assert 0 < part.outputs <= len(part.tokens)
            rows.append(i)
            first_output = len(part.tokens) - part.outputs
            for j, token in enumerate(part.tokens):
                batch.token[i] = token
                batch.pos[i] = part.start + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = part.seq
                batch.logits[i] = j >= first_output
                i += 1
        # A speculative check is a decode of a few tokens: it takes the thread count the
        # governor chose for single tokens (under contention, two threads spinning at ggml's
        # barriers made checks of 2-17 tokens 5-30 times slower than one token here).
        few = (len(parts) == 1 and parts[0].outputs > 1
               and self.governor.threads != self._batch_threads)
        if few:
            self._lib.llama_set_n_threads(self.ctx, self.governor.threads, self.governor.threads)
        try:
            with self.armed_abort() if abortable else contextlib.nullcontext():
                status = self._lib.llama_decode(self.ctx, batch)
        finally:
            if few:
                self.set_threads(self.governor.threads)
        if status != 0:
            # llama.cpp drops a failed batch's cells itself; make sure nothing of it stays.
            for part in parts:
                self._lib.llama_memory_seq_rm(self._memory, part.seq, part.start, -1)
            if status == 2:
                raise DecodeAborted
            if status == 1:
                raise KVFull("the context is full (no KV cache slot for the batch)")
            raise EngineError(f"llama_decode failed with status {status}")
        return rows

    @property
    def batch_threads(self) -> int:
        """Threads a prompt batch runs on (an image projector encodes on as many)."""
        return self._batch_threads

    def set_threads(self, threads: int) -> None:
        """Threads for single-token decodes from now on (llama_set_n_threads). Prefill batches
        keep every core: the governor times single-token decodes, where another program's load
        can make fewer threads win, but a batch's large matmuls outweigh the barrier waits
        (measured: a 1,000-token paste prefilled at ~75 tokens/s on one thread of a 2-core CPU
        against ~135 on two, after a decode in the busy app had switched to one)."""
        self._lib.llama_set_n_threads(self.ctx, threads, self._batch_threads)

    def alone(self, action: Callable[[], None]) -> None:
        """Run ``action``, llama.cpp work that decodes on this sequence by itself (an image's
        evaluation): here at once; a parallel slot's view runs it as a step of its own."""
        action()

    @contextlib.contextmanager
    def armed_abort(self) -> Iterator[None]:
        """llama_decode calls made inside (a prefill's, and libmtmd's for a picture's
        embeddings) stop when this runtime's turn is stopped: llama.cpp then returns 2 and keeps
        no cells of the batch it was in."""
        self._lib.llama_set_abort_callback(self.ctx, self._abort_callback, None)
        try:
            yield
        finally:
            self._lib.llama_set_abort_callback(self.ctx, self._no_callback, None)

    def arm_abort_check(self, check: Callable[[], bool] | None) -> None:
        """What the armed abort callback asks from now on (None: this runtime's own flag,
        ``request_abort``; a batch of one slot's prefill asks that slot's)."""
        self.abort_check = check or self._abort_requested.is_set

    def settle_outputs(self, n_outputs: int) -> np.ndarray:
        """The last batch's ``n_outputs`` rows of logits in batch order (llama.cpp orders them
        on the first read), as one view valid until the next decode: whoever reads a row
        afterwards only reads, and slices it without a call into llama.cpp (a ctypes call lets
        go of the GIL, and another thread takes it)."""
        return np.ctypeslib.as_array(self._lib.llama_get_logits(self.ctx),
                                     shape=(n_outputs, self.n_vocab))

    def request_abort(self) -> None:
        self._abort_requested.set()

    def clear_abort(self) -> None:
        self._abort_requested.clear()

    @property
    def abort_requested(self) -> bool:
        return self._abort_requested.is_set()

    def last_logits(self) -> np.ndarray:
        return self.logits_at(-1)

    def logits_at(self, index: int) -> np.ndarray:
        """The logits after the last decode's ``index``-th token (-1: its last output), as a
        view of llama.cpp's buffer (edits go there, for its sampler chain to read), valid until
        the next decode; that token must have had its logits requested (``decode``'s
        ``outputs``). The last output's view is kept while llama.cpp keeps the buffer where it
        was: making one costs ~60 us a token right after a decode has flushed the CPU caches."""
        ptr = self._lib.llama_get_logits_ith(self.ctx, index)
        if index != -1:
            return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if address != self._logits_address or self._logits_view is None:
            self._logits_view = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            self._logits_address = address
        return self._logits_view

    def new_sampler(self, sampling: Sampling, constraint: TokenJudge | None = None) -> Sampler:
        """The turn's sampler; with ``constraint``, every token it draws is the grammar's to
        judge (``engine.sampling.constrained``)."""
        return Sampler(self._lib, sampling, self.ctx, self.logits_at, constraint)

    # -- KV cache -----------------------------------------------------------------------------

    def remove(self, start: int, end: int) -> bool:
        """Forget positions [start, end) of the conversation (end -1 = to the end). False when
        the memory cannot (a recurrent state cannot lose part of its history): nothing changed.
        With a sliding-window cache that keeps only the window, removal succeeds but the cells
        the window needs before ``start`` may be gone: that is reported as False too."""
        if not self._lib.llama_memory_seq_rm(self._memory, self.seq, start, end):
            return False
        if self.memory_kind == "swa" and not self.swa_full and end < 0 and start > 0:
            return self.min_position() <= max(0, start - self.n_swa)
        return True

    def move(self, start: int, end: int, delta: int) -> None:
        """Add ``delta`` to the positions of cells in [start, end) (a context shift)."""
        self._lib.llama_memory_seq_add(self._memory, self.seq, start, end, delta)

    def clear(self) -> None:
        """Forget the sequence's cells (with one sequence, the whole cache)."""
        if self.n_seq == 1:
            self._lib.llama_memory_clear(self._memory, True)
        else:
            self._lib.llama_memory_seq_rm(self._memory, self.seq, -1, -1)

    def min_position(self) -> int:
        """Lowest position held for the conversation (-1 when empty)."""
        return int(self._lib.llama_memory_seq_pos_min(self._memory, self.seq))

    def max_position(self) -> int:
        """Highest position held for the conversation (-1 when empty)."""
        return int(self._lib.llama_memory_seq_pos_max(self._memory, self.seq))

    def export_sequence(self) -> memoryview:
        """The conversation's KV cells (llama_state_seq_get_data), to restore them later. A view
        of the buffer llama.cpp wrote (no second copy of tens of MB on the engine thread)."""
        size = self._lib.llama_state_seq_get_size(self.ctx, self.seq)
        buf = (ctypes.c_uint8 * size)()
        written = self._lib.llama_state_seq_get_data(self.ctx, buf, size, self.seq)
        return memoryview(buf).cast("B")[:written]

    def checkpoint_data(self) -> bytes:
        """The part of the conversation's state that cannot be rolled back by removing cells
        (recurrent state, sliding-window cells), as llama-server's context checkpoints keep it."""
        flags = self._lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = self._lib.llama_state_seq_get_size_ext(self.ctx, self.seq, flags)
        buf = (ctypes.c_uint8 * size)()
        written = self._lib.llama_state_seq_get_data_ext(self.ctx, buf, size, self.seq, flags)
        return bytes(memoryview(buf).cast("B")[:written])

    def restore_checkpoint(self, data: bytes, n_tokens: int) -> bool:
        """Put back a checkpoint taken when the conversation held ``n_tokens`` cells, and drop
        the other cells after it (attention layers of a hybrid can); False if llama.cpp refuses."""
        buf, _keep = _readable(data)
        flags = self._lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if self._lib.llama_state_seq_set_data_ext(self.ctx, buf, len(data), self.seq, flags) == 0:
            return False
        return bool(self._lib.llama_memory_seq_rm(self._memory, self.seq, n_tokens, -1))

    def import_sequence(self, data: bytes | memoryview) -> bool:
        """Replace the conversation's KV cells with ``data``; False if llama.cpp rejects it."""
        self.clear()
        buf, _keep = _readable(data)
        if self._lib.llama_state_seq_set_data(self.ctx, buf, len(data), self.seq) == 0:
            self.clear()
            return False
        return True

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        self.llama.close()


def _readable(data: bytes | memoryview) -> tuple[Any, np.ndarray]:
    """A pointer llama.cpp can read ``data`` through, without a copy, and the array that keeps
    the buffer alive meanwhile. Copying a 2,000-cell snapshot (~45 MB) into a ctypes array took
    30-200 ms (its fresh pages are faulted in one by one), against ~4 ms for llama.cpp to load it:
    most of what restoring a session cost before its first token."""
    array = np.frombuffer(data, dtype=np.uint8)
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), array


def _new_llama(llama_cpp, model_path: str, n_seq_max: int = 1, **params):
    """``Llama(model_path, **params)``, also for a GGUF whose embedded chat template does not
    compile. llama-cpp-python compiles every template in the metadata for chat handlers that
    localchat never uses (it renders templates itself, where a bad one is a one-line error and
    a chat_template override still works); a Jinja error there must not stop the load.
    ``n_seq_max``: sequences the context holds, all in one cache (``Llama`` has no parameter
    for either: its context parameters start from llama.cpp's defaults, which are set here)."""
    import jinja2

    with _context_defaults(llama_cpp, n_seq_max):
        try:
            return llama_cpp.Llama(model_path, **params)
        except jinja2.TemplateError:
            pass
        formats = llama_cpp.llama_chat_format
        original = formats.Jinja2ChatFormatter
        formats.Jinja2ChatFormatter = _UnusedChatHandler
        try:
            return llama_cpp.Llama(model_path, **params)
        finally:
            formats.Jinja2ChatFormatter = original


@contextlib.contextmanager
def _context_defaults(llama_cpp, n_seq_max: int) -> Iterator[None]:
    """While a ``Llama`` is made: its context holds ``n_seq_max`` sequences, each in a stream of
    the cache of its own (n_ctx / n_seq_max cells). One unified cache would let a sequence use
    any cell, but every decode then attends over every sequence's cells (masked): measured on the
    test model, a slot decoding at depth 300 took 18 ms a token while three others held 1,500
    cells each, against 7.7 ms with a stream each."""
    if n_seq_max <= 1:
        yield
        return
    bindings = llama_cpp.llama_cpp
    original = bindings.llama_context_default_params

    def defaults():  # noqa: ANN202 - llama.cpp's struct
        params = original()
        params.n_seq_max = n_seq_max
        params.kv_unified = False
        return params

    bindings.llama_context_default_params = defaults
    try:
        yield
    finally:
        bindings.llama_context_default_params = original


class _UnusedChatHandler:
    """Stands in for llama-cpp-python's formatter while loading a GGUF with a broken template."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def to_chat_handler(self):
        def refuse(*args, **kwargs):
            raise RuntimeError("the GGUF's chat template does not compile")

        return refuse
