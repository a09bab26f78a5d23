"""A loaded image projector (``mmproj``): libmtmd over the text model, called directly.

llama-cpp-python's chat handlers clear the KV cache on every call; the engine keeps its own
records instead (``image_records``), so it only asks libmtmd for two things: an image's tokens
(``mtmd_tokenize_from_parts`` on the picture alone: the image chunk, between the text chunks of
any wrapper tokens the model puts around a picture) and their evaluation at a position of the
conversation (``mtmd_helper_eval_chunk_single``: the projector encodes the picture, then the
embeddings are decoded into the KV cache in batches of ``n_batch``).

Models that place an image's tokens on a 2-D grid of positions (M-RoPE: Qwen2-VL and later) take
fewer positions than tokens; the engine's records count one cell per position, so such a
projector is refused in one line at the first image, never half supported.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.engine import llama_log
from localchat.engine.image_input import check_image
from localchat.engine.image_records import (
    MAX_IMAGE_TOKENS,
    Tokenize,
    TurnImages,
    image_key,
    key_of,
    placeholders,
    tokenize_with_images,
    with_image_tags,
)
from localchat.engine.runtime import DecodeAborted
from localchat.engine.vision import image_support
from localchat.errors import EngineError, UserError

_TEXT, _IMAGE = 0, 1  # MTMD_INPUT_CHUNK_TYPE_*
_KEEP = 8  # images whose tokens stay made (a conversation's pictures, turn after turn)


@dataclass
class _Tokenized:
    chunks: Any  # mtmd_input_chunks*, owned
    tokens: list[int]  # wrapper text tokens and the image's placeholders, in order
    image: Any  # the image chunk inside ``chunks``


class Projector:
    """One projector file loaded for one text model (engine thread only)."""

    def __init__(self, path: Path, runtime: Any, use_gpu: bool = False) -> None:
        support = image_support()
        if not support.available:
            raise EngineError(f"images are {support}")
        from llama_cpp import mtmd_cpp

        self._m = mtmd_cpp
        self.path = Path(path)
        llama_log.silence()
        if llama_log.callback() is not None:
            mtmd_cpp.mtmd_helper_log_set(llama_log.callback(), None)
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = runtime.batch_threads
        params.print_timings = False
        params.warmup = False
        with llama_log.quiet_stderr():
            ctx = mtmd_cpp.mtmd_init_from_file(str(self.path).encode(), runtime.model.model, params)
        if not ctx:
            raise EngineError(f"could not load the image projector {self.path.name} "
                              "(llama.cpp refused it; `localchat doctor` shows its log file)")
        self._ctx = ctx
        self._runtime = runtime
        self._made: OrderedDict[str, _Tokenized] = OrderedDict()
        # The engine thread evaluates; the context's budget may count a prompt's tokens (and so
        # tokenize a picture) on its own thread meanwhile.
        self._lock = threading.RLock()
        self._keys: dict[int, str] = {}
        self.mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(ctx))

    def __repr__(self) -> str:
        return f"<Projector {self.path.name}>"

    def tokens(self, sha: str, data: bytes) -> list[int]:
        """The record's tokens for the picture ``data`` (SHA-256 ``sha``). UserError when
        libmtmd cannot decode it."""
        with self._lock:
            return self._tokenized(sha, data).tokens

    def evaluate(self, key: int, n_tokens: int, position: int, images: TurnImages,
                 runtime: Any = None) -> None:
        """Encode the image whose placeholders carry ``key`` and decode its ``n_tokens``
        embeddings at ``position``.. of ``runtime``'s sequence (a parallel slot's view runs
        it as a step of its own: ``LlamaRuntime.alone``; default: the text model's)."""
        target = runtime if runtime is not None else self._runtime
        with self._lock:
            target.alone(lambda: self._evaluate(key, n_tokens, position, images, target))

    def _evaluate(self, key: int, n_tokens: int, position: int, images: TurnImages,
                  runtime: Any) -> None:
        sha = self._keys.get(key)
        if sha is None or sha not in images.by_sha:
            sha = next((s for s in images.by_sha if key_of(s) == key), None)
        if sha is None:
            raise EngineError("the prompt holds an image this turn was not given")
        made = self._tokenized(sha, images.by_sha[sha])
        if self._m.mtmd_input_chunk_get_n_tokens(made.image) != n_tokens:
            raise EngineError("an image's cells do not match its tokens")
        new_past = ctypes.c_int32(0)
        # A stop ends the decode of its embeddings mid-batch (the projector's encode before it
        # runs to its end: libmtmd's graph has no abort callback).
        with runtime.armed_abort():
            status = self._m.mtmd_helper_eval_chunk_single(
                self._ctx, runtime.ctx, made.image, position, runtime.seq, runtime.n_batch,
                False, ctypes.byref(new_past))
        if status != 0:
            runtime.remove(position, -1)  # no part of a picture stays
            if status == 2 and runtime.abort_requested:
                raise DecodeAborted
            raise EngineError(f"the image could not be evaluated (libmtmd status {status})")

    def _tokenized(self, sha: str, data: bytes) -> _Tokenized:
        made = self._made.get(sha)
        if made is not None:
            self._made.move_to_end(sha)
            return made
        made = self._tokenize(sha, data)
        self._made[sha] = made
        self._keys[key_of(sha)] = sha
        while len(self._made) > _KEEP:
            old_sha, old = self._made.popitem(last=False)
            self._keys.pop(key_of(old_sha), None)
            self._m.mtmd_input_chunks_free(old.chunks)
        return made

    def _tokenize(self, sha: str, data: bytes) -> _Tokenized:
        m = self._m
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with llama_log.quiet_stderr():
            bitmap = m.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        if not bitmap:
            raise UserError("the image could not be decoded (not a JPEG, PNG, BMP or GIF "
                            "libmtmd can read)")
        chunks = m.mtmd_input_chunks_init()
        try:
            part = m.mtmd_input_part(None, bitmap)
            parts = (ctypes.POINTER(m.mtmd_input_part) * 1)(ctypes.pointer(part))
            status = m.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 1, False)
            if status != 0:
                raise UserError(f"the image could not be read by the projector (status {status})")
            tokens: list[int] = []
            image = None
            for i in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                tokens += self._chunk_tokens(chunk, sha)
                if m.mtmd_input_chunk_get_type(chunk) == _IMAGE:
                    if image is not None:
                        raise UserError("this projector cuts an image into several slices, "
                                        "which localchat does not read yet")
                    image = chunk
            if image is None:
                raise UserError("the projector made no image tokens of the picture")
        except BaseException:
            m.mtmd_input_chunks_free(chunks)
            raise
        finally:
            m.mtmd_bitmap_free(bitmap)
        return _Tokenized(chunks, tokens, image)

    def _chunk_tokens(self, chunk: Any, sha: str) -> list[int]:
        m = self._m
        kind = m.mtmd_input_chunk_get_type(chunk)
        if kind == _TEXT:
            n = ctypes.c_size_t(0)
            ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            return [int(ids[j]) for j in range(n.value)]
        if kind != _IMAGE:
            raise UserError("the projector reads audio, not images")
        n_tokens = int(m.mtmd_input_chunk_get_n_tokens(chunk))
        n_pos = int(m.mtmd_input_chunk_get_n_pos(chunk))
        if self.mrope or n_pos != n_tokens:
            raise UserError(f"{self.path.name} places image tokens on a grid of positions "
                            "(M-RoPE), which localchat does not support yet")
        if n_tokens > MAX_IMAGE_TOKENS:
            raise UserError(f"the image takes {n_tokens} tokens; localchat reads at most "
                            f"{MAX_IMAGE_TOKENS} per image")
        return placeholders(sha, n_tokens)

    def close(self) -> None:
        with self._lock:
            self._free()

    def _free(self) -> None:
        for made in self._made.values():
            self._m.mtmd_input_chunks_free(made.chunks)
        self._made.clear()
        if self._ctx:
            self._m.mtmd_free(self._ctx)
            self._ctx = None


class ImageEval:
    """What a turn's prefill needs to evaluate images: the projector and the turn's pictures,
    and what it spent (``images_n`` encoded, ``image_ms``)."""

    def __init__(self, projector: Projector, images: TurnImages) -> None:
        self.projector = projector
        self.images = images
        self.images_n = 0
        self.image_ms = 0.0

    def tokens(self, sha: str) -> list[int]:
        return self.projector.tokens(sha, self.images.by_sha[sha])

    def evaluate(self, first_token: int, n_tokens: int, position: int, runtime: Any) -> None:
        started = time.perf_counter()
        self.projector.evaluate(image_key(first_token), n_tokens, position, self.images, runtime)
        self.image_ms += (time.perf_counter() - started) * 1000.0
        self.images_n += 1


class Vision:
    """What a loaded engine reads images with: its projector, or why it has none."""

    def __init__(self, projector: Projector | None = None, problem: str = "") -> None:
        self.projector = projector
        self.problem = problem  # why a projector that was given did not load

    @property
    def path(self) -> Path | None:
        return self.projector.path if self.projector is not None else None

    def for_turn(self, messages: list[dict], tokenize: Tokenize, model: str,
                 kv: Any = None) -> tuple[list[dict], Tokenize]:
        """A turn's ``messages`` with their pictures as tags (``image_records.with_image_tags``)
        and the tokenizer that reads those tags; with a ``kv``, what its prefill evaluates the
        pictures with is set (``kv.images``). UserError for pictures this engine cannot read."""
        shaped, images = with_image_tags(messages)
        evaluator = None
        if images:
            for data in images.by_sha.values():
                check_image(data, "an image of this turn")
            if self.projector is None:
                raise UserError(f"{model} does not read images "
                                f"({self.problem or 'it has no image projector'})")
            evaluator = ImageEval(self.projector, images)
            tokenize = tokenize_with_images(tokenize, evaluator.tokens, images)
        if kv is not None:
            kv.images = evaluator
        return shaped, tokenize

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()
            self.projector = None
