"""A small pure-Python reader for GGUF headers (versions 2 and 3).

It reads the metadata key/values and the tensor table, never the tensor data, so it is cheap even
for multi-GB files (the file is memory-mapped; only the header pages are touched). What it is for:
validating a file before use (``import``), showing facts about a model (``doctor``, ``models``),
and sizing GPU offload (per-layer weight bytes, KV-cache dimensions).

Layout (little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64 metadata count, then
metadata entries (string key, u32 type, value), then tensor infos (name, u32 n_dims, u64 dims,
u32 ggml type, u64 offset relative to the data section), then padding to ``general.alignment``
(default 32), then tensor data.
"""

from __future__ import annotations

import functools
import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.errors import UserError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Arrays longer than this (the tokenizer's vocabulary, merges, scores) are summarized rather than
# decoded: nothing here needs their values, and decoding 150k strings costs real time.
MAX_DECODED_ARRAY = 1024
MAX_ARRAY_NESTING = 16  # arrays of arrays deeper than this are refused (no RecursionError)

# ggml type id -> (name, elements per block, bytes per block). From ggml's type traits.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}

# Metadata value types: id -> struct format for scalars.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")


class GGUFError(UserError):
    """The file is not a readable GGUF model (wrong magic, unsupported version, truncated)."""


# llama.cpp's llm_arch_is_recurrent / llm_arch_is_hybrid (src/llama-arch.cpp).
RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35",
    "qwen35moe", "qwen4exp", "deepseek4", "minimax-01"})


# Every n-th layer attends to the whole context, the others to the window (llama.cpp's defaults).
SWA_PERIODS = {"gemma2": 2, "gemma3": 6, "cohere2": 4}


@dataclass(frozen=True)
class ArraySummary:
    """Stands in for a long metadata array whose values were skipped."""

    element_type: int
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"type{self.ggml_type}", 0, 0))[0]

    @property
    def n_elements(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def n_bytes(self) -> int:
        """Size of this tensor's data, from its ggml type's block size."""
        _, block, block_bytes = GGML_TYPES[self.ggml_type]
        return self.n_elements // block * block_bytes

    @property
    def layer(self) -> int | None:
        """The repeating block (``blk.N.*``) this tensor belongs to, or None for the rest."""
        match = _LAYER_TENSOR.match(self.name)
        return int(match.group(1)) if match else None


@dataclass
class GGUFInfo:
    """What a GGUF header says. Derived fields are None when the metadata lacks them."""

    path: Path
    version: int
    file_size: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int  # where tensor data starts in the file
    architecture: str | None = None
    n_layers: int | None = None
    context_length: int | None = None
    embedding_length: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None  # key head size
    value_head_dim: int | None = None
    chat_template: str | None = None
    layer_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def data_end(self) -> int:
        """Offset just past the last tensor's data: a complete file is at least this long."""
        if not self.tensors:
            return self.data_offset
        return self.data_offset + max(t.offset + t.n_bytes for t in self.tensors)

    @property
    def is_complete(self) -> bool:
        return self.file_size >= self.data_end

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        """Parameter count: the elements of every tensor (``general.parameter_count`` is optional
        metadata that many converters leave out; the tensor table is always there)."""
        return sum(t.n_elements for t in self.tensors)

    @property
    def non_layer_bytes(self) -> int:
        """Weights outside the repeating blocks (embeddings, output head, final norm)."""
        return self.tensor_bytes - sum(self.layer_bytes.values())

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return value if isinstance(value, str) else None

    @property
    def quantization(self) -> str | None:
        """The dominant weight type, e.g. "Q4_K" (by bytes, over 2-D tensors)."""
        totals: dict[str, int] = {}
        for tensor in self.tensors:
            if len(tensor.shape) >= 2:
                totals[tensor.type_name] = totals.get(tensor.type_name, 0) + tensor.n_bytes
        return max(totals, key=totals.__getitem__) if totals else None

    @property
    def memory_kind(self) -> str:
        """kv | swa | recurrent | hybrid, from the architecture and metadata, as llama.cpp
        classifies it at load (engine/runtime.memory_kind), without loading the model."""
        arch = self.architecture or ""
        if arch in RECURRENT_ARCHITECTURES:
            return "recurrent"
        if arch in HYBRID_ARCHITECTURES:
            return "hybrid"
        window = self.metadata.get(f"{arch}.attention.sliding_window")
        return "swa" if isinstance(window, int) and window > 0 else "kv"

    def kv_cache_bytes(self, n_ctx: int, bytes_per_element: float = 2.0, *, swa_full: bool = True,
                       n_ubatch: int = 512) -> int:
        """KV-cache bytes llama.cpp allocates for ``n_ctx``: only layers with attention heads
        (a hybrid's recurrent layers have none), and window-size caches for sliding-window
        layers unless ``swa_full`` (the window plus one micro-batch, in steps of 256 cells)."""
        arch = self.architecture or ""
        if not (self.n_layers and self.head_dim):
            return 0
        heads = self.metadata.get(f"{arch}.attention.head_count_kv")
        per_layer = (list(heads) if isinstance(heads, list) and len(heads) == self.n_layers
                     else [self.n_kv_heads or 0] * self.n_layers)
        window = self.metadata.get(f"{arch}.attention.sliding_window")
        windowed = isinstance(window, int) and window > 0 and not swa_full
        window_cells = min(n_ctx, -(-(window + n_ubatch) // 256) * 256) if windowed else n_ctx
        value_dim = self.value_head_dim or self.head_dim
        total = 0.0
        for layer, n_heads in enumerate(per_layer):
            cells = window_cells if windowed and self._is_swa_layer(layer) else n_ctx
            total += cells * n_heads * (self.head_dim + value_dim) * bytes_per_element
        return int(total)

    def _is_swa_layer(self, layer: int) -> bool:
        """Whether ``layer`` uses the sliding window: the GGUF's pattern, else the
        architecture's (Gemma 3: five of six layers; unknown: none, an over-estimate)."""
        arch = self.architecture or ""
        pattern = self.metadata.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, list) and layer < len(pattern):
            return bool(pattern[layer])
        period = pattern if isinstance(pattern, int) and pattern > 0 else SWA_PERIODS.get(arch, 0)
        return bool(period) and (layer + 1) % period != 0

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> int | None:
        """KV-cache bytes one token of context costs across all layers (f16 cache by default)."""
        if not (self.n_layers and self.n_kv_heads and self.head_dim):
            return None
        return self.kv_cache_bytes(1, bytes_per_element)

    def require_complete(self) -> None:
        """Raise GGUFError if the file is shorter than its tensor table says (a cut download)."""
        if not self.is_complete:
            raise GGUFError(
                f"{self.path} is truncated: its tensors need {self.data_end} bytes but the file "
                f"has {self.file_size} (an interrupted download or copy?)"
            )


def read_gguf(path: Path | str) -> GGUFInfo:
    """Read the header of the GGUF file at ``path``.

    Raises :class:`GGUFError` (a UserError) for a missing, unreadable, non-GGUF, unsupported or
    truncated header. A file whose header is intact but whose tensor data is cut short is read
    fine; check :attr:`GGUFInfo.is_complete` or call :meth:`GGUFInfo.require_complete`.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 24:
                _check_magic(path, f.read(4))
                raise GGUFError(f"{path} is truncated: the GGUF header is incomplete")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, size)
    except FileNotFoundError:
        raise GGUFError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise GGUFError(f"{path} is a directory, not a .gguf file") from None
    except PermissionError:
        raise GGUFError(f"permission denied reading {path}") from None


def _check_magic(path: Path, magic: bytes) -> None:
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF model file (it does not start with 'GGUF')")


def _parse(path: Path, buf: mmap.mmap, size: int) -> GGUFInfo:
    _check_magic(path, buf[:4])
    reader = _Reader(buf, path)
    reader.pos = 4
    version = reader.scalar("<I")
    if version not in (2, 3):
        if version in (0x02000000, 0x03000000):
            raise GGUFError(f"{path} is a big-endian GGUF file, which is not supported")
        raise GGUFError(f"{path} uses GGUF version {version}; only versions 2 and 3 are supported")
    n_tensors = reader.scalar("<Q")
    n_metadata = reader.scalar("<Q")

    metadata: dict[str, Any] = {}
    for _ in range(n_metadata):
        key = reader.string()
        metadata[key] = reader.value(reader.scalar("<I"))

    tensors = []
    for _ in range(n_tensors):
        name = reader.string()
        n_dims = reader.scalar("<I")
        shape = tuple(reader.scalar("<Q") for _ in range(n_dims))
        ggml_type = reader.scalar("<I")
        if ggml_type not in GGML_TYPES:
            raise GGUFError(f"{path}: tensor {name} has an unknown ggml type {ggml_type}")
        tensors.append(TensorInfo(name, shape, ggml_type, reader.scalar("<Q")))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    data_offset = -(-reader.pos // alignment) * alignment
    info = GGUFInfo(path=path, version=version, file_size=size, metadata=metadata,
                    tensors=tensors, data_offset=data_offset)
    _derive(info)
    return info


def _derive(info: GGUFInfo) -> None:
    """Fill the convenience fields from ``{arch}.*`` metadata and the tensor table."""
    meta = info.metadata
    arch = meta.get("general.architecture")
    info.architecture = arch if isinstance(arch, str) else None
    prefix = f"{info.architecture}." if info.architecture else ""
    info.n_layers = _int(meta.get(prefix + "block_count"))
    info.context_length = _int(meta.get(prefix + "context_length"))
    info.embedding_length = _int(meta.get(prefix + "embedding_length"))
    info.n_heads = _int(meta.get(prefix + "attention.head_count"))
    # Without GQA the KV head count equals the head count (and the key is often absent).
    info.n_kv_heads = _int(meta.get(prefix + "attention.head_count_kv")) or info.n_heads
    info.head_dim = _int(meta.get(prefix + "attention.key_length"))
    if info.head_dim is None and info.embedding_length and info.n_heads:
        info.head_dim = info.embedding_length // info.n_heads
    info.value_head_dim = _int(meta.get(prefix + "attention.value_length")) or info.head_dim
    template = meta.get("tokenizer.chat_template")
    info.chat_template = template if isinstance(template, str) and template else None
    for tensor in info.tensors:
        if tensor.layer is not None:
            info.layer_bytes[tensor.layer] = info.layer_bytes.get(tensor.layer, 0) + tensor.n_bytes


def _int(value: Any) -> int | None:
    """An integer metadata value; per-layer arrays (some models vary heads by layer) -> the max."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return None


class _Reader:
    """Sequential little-endian reads over the mapped header; running off the end = truncated."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path} is truncated: the GGUF header runs past the end of "
                            "the file")

    def scalar(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self._need(n)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.scalar("<Q")
        self._need(n)
        self.pos += n

    def value(self, value_type: int, depth: int = 0) -> Any:
        if value_type in _SCALARS:
            return self.scalar(_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            # Real files nest arrays one or two deep; a crafted one could exhaust the stack.
            if depth >= MAX_ARRAY_NESTING:
                raise GGUFError(f"{self.path}: GGUF metadata nests arrays more than "
                                f"{MAX_ARRAY_NESTING} deep (corrupt or hostile header)")
            return self.array(depth + 1)
        raise GGUFError(f"{self.path}: unknown GGUF metadata type {value_type} (corrupt header?)")

    def array(self, depth: int = 1) -> list[Any] | ArraySummary:
        element_type = self.scalar("<I")
        length = self.scalar("<Q")
        if length <= MAX_DECODED_ARRAY:
            return [self.value(element_type, depth) for _ in range(length)]
        if element_type in _SCALARS:
            n = struct.calcsize(_SCALARS[element_type]) * length
            self._need(n)
            self.pos += n
        elif element_type == _STRING:
            for _ in range(length):
                self.skip_string()
        else:  # arrays of arrays: walk them, discarding values
            for _ in range(length):
                self.value(element_type, depth)
        return ArraySummary(element_type, length)


@functools.lru_cache(maxsize=8)
def _cached_parameter_count(path: str, mtime_ns: int, size: int) -> int | None:
    try:
        return read_gguf(path).n_params or None
    except GGUFError:
        return None


def parameter_count(path: Path | str) -> int | None:
    """The parameter count of the GGUF at ``path``, read once per file version (the router asks
    every turn); None when the file is missing or unreadable."""
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return _cached_parameter_count(str(path), stat.st_mtime_ns, stat.st_size)
