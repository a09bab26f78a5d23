"""GGUF headers read through llama.cpp's own ``gguf`` package (``gguf.GGUFReader``).

It reads the metadata key/values and the tensor table, never the tensor data, so it is cheap even
for multi-GB files (the file is memory-mapped; only the header pages are touched). What it is for:
validating a file before use (``import``, ``pull``), showing facts about a model (``doctor``,
``models``), and sizing GPU offload (per-layer weight bytes, KV-cache dimensions).

``GGUFReader`` as shipped decodes every element of every metadata array into its own numpy view
(a 262k-token vocabulary takes tens of seconds) and views every tensor's data (a file cut short in
its data fails to open). :class:`_HeaderReader` changes just those two steps: long arrays are
skipped and summarized, and the tensor table is kept as read. The ``gguf`` package (and numpy with
it) is imported on the first read, not when this module is imported.
"""

from __future__ import annotations

import functools
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.errors import UserError

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderField

GGUF_MAGIC = b"GGUF"

# Arrays longer than this (the tokenizer's vocabulary, merges, scores) are summarized rather than
# decoded: nothing here needs their values, and decoding 150k strings costs real time.
MAX_DECODED_ARRAY = 1024

_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
_U64 = struct.Struct("<Q")


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
    type_name: str  # ggml's name for ggml_type, e.g. "Q4_K"
    n_bytes: int  # size of this tensor's data, from its ggml type's block size

    @property
    def n_elements(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

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
        window_cells = (min(n_ctx, -(-(window + n_ubatch) // 256) * 256)
                        if windowed and isinstance(window, int) else n_ctx)
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
        if not path.is_dir() and not stat.S_ISREG(path.stat().st_mode):
            # Opening a FIFO blocks until a writer comes; a device may never end.
            raise GGUFError(f"{path} is not a regular file (a FIFO, socket or device); "
                            "give the path of a .gguf file")
        with path.open("rb") as f:
            size = path.stat().st_size
            start = f.read(8)
    except FileNotFoundError:
        raise GGUFError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise GGUFError(f"{path} is a directory, not a .gguf file") from None
    except PermissionError:
        raise GGUFError(f"permission denied reading {path}") from None
    _check_start(path, start, size)
    try:
        reader = _header_reader_class()(path)
        info = _info(path, size, reader)
    except RecursionError:  # GGUFReader recurses once per level of arrays of arrays
        raise GGUFError(f"{path}: GGUF metadata nests arrays too deep (corrupt or hostile "
                        "header)") from None
    except (ValueError, IndexError, KeyError, OverflowError, struct.error) as exc:
        # GGUFReader reads past the end of a cut header as short arrays, which then fail to
        # unpack or reshape; a corrupt length field fails the same way.
        raise GGUFError(f"{path} is truncated or corrupt: its GGUF header cannot be read "
                        f"({exc})") from None
    if info.data_offset > size:
        raise GGUFError(f"{path} is truncated: the GGUF header runs past the end of the file")
    return info


def _check_start(path: Path, start: bytes, size: int) -> None:
    """Magic and version, checked here so that the refusals name the problem for the user."""
    if start[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF model file (it does not start with 'GGUF')")
    if size < 24:
        raise GGUFError(f"{path} is truncated: the GGUF header is incomplete")
    (version,) = struct.unpack("<I", start[4:8])
    if version in (0x02000000, 0x03000000):
        raise GGUFError(f"{path} is a big-endian GGUF file, which is not supported")
    if version not in (2, 3):
        raise GGUFError(f"{path} uses GGUF version {version}; only versions 2 and 3 are supported")


def _info(path: Path, size: int, reader: GGUFReader) -> GGUFInfo:
    start = int(reader.data_offset)
    tensors = [TensorInfo(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type),
                          t.data_offset - start, t.tensor_type.name, int(t.n_bytes))
               for t in reader.tensors]
    metadata = {name: _value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    info = GGUFInfo(path=path, version=int(reader.fields["GGUF.version"].parts[0][0]),
                    file_size=size, metadata=metadata, tensors=tensors, data_offset=start)
    _derive(info)
    return info


def _value(reader_field: ReaderField) -> Any:
    """A metadata value as Python data: str, int, float, bool, a list, or an ArraySummary."""
    from gguf import GGUFValueType

    parts, kinds = reader_field.parts, reader_field.types
    if kinds[0] == GGUFValueType.STRING:
        return bytes(parts[-1]).decode("utf-8", errors="replace")
    if kinds[0] != GGUFValueType.ARRAY:
        return parts[-1].tolist()[0]
    # parts: key length, key, value type, element type, length, then the elements' parts.
    element_type, length = int(parts[3][0]), int(parts[4][0])
    if length > MAX_DECODED_ARRAY:
        return ArraySummary(element_type, length)
    if kinds[-1] == GGUFValueType.STRING:
        return [bytes(parts[i]).decode("utf-8", errors="replace") for i in reader_field.data]
    # GGUFReader flattens arrays of arrays; nothing read here nests them.
    return [parts[i].tolist()[0] for i in reader_field.data]


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


@functools.cache
def _header_reader_class() -> type[GGUFReader]:
    """The GGUFReader subclass, defined on first use so that importing this module stays cheap."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderTensor

    class _HeaderReader(GGUFReader):
        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[
                int, list[np.ndarray[Any, Any]], list[int], list[GGUFValueType]]:
            if raw_type == GGUFValueType.ARRAY:
                element_type = int(self._get(orig_offs, np.uint32)[0])
                length = int(self._get(orig_offs + 4, np.uint64)[0])
                if length > MAX_DECODED_ARRAY:
                    size = self._skipped_array_size(orig_offs + 12, element_type, length)
                    if size is not None:
                        return (12 + size, [self._get(orig_offs, np.uint32),
                                            self._get(orig_offs + 4, np.uint64)],
                                [], [GGUFValueType.ARRAY, GGUFValueType(element_type)])
            return super()._get_field_parts(orig_offs, raw_type)

        def _skipped_array_size(self, offs: int, element_type: int, length: int) -> int | None:
            """Bytes of ``length`` elements at ``offs``, without decoding them (None: arrays of
            arrays, left to GGUFReader)."""
            scalar = self.gguf_scalar_to_np.get(GGUFValueType(element_type))
            if scalar is not None:
                return int(np.dtype(scalar).itemsize) * length
            if element_type != GGUFValueType.STRING:
                return None
            buf, start = self.data.data, offs  # struct on the raw map: numpy per string is slow
            for _ in range(length):
                offs += 8 + _U64.unpack_from(buf, offs)[0]
            return offs - start

        def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
            # GGUFReader's, minus the views of the tensor data: a file cut short still opens.
            self.tensors = []
            for tensor_field in fields:
                _, name, _, dims, raw_type, offset = tensor_field.parts
                ggml_type = GGMLQuantizationType(int(raw_type[0]))
                block, block_bytes = GGML_QUANT_SIZES[ggml_type]
                n_elements = int(np.prod(dims))
                self.tensors.append(ReaderTensor(
                    name=bytes(name).decode("utf-8", errors="replace"), tensor_type=ggml_type,
                    shape=dims, n_elements=n_elements, n_bytes=n_elements // block * block_bytes,
                    data_offset=start_offs + int(offset[0]), data=np.empty(0, np.uint8),
                    field=tensor_field))

    return _HeaderReader


def parameter_count(path: Path | str) -> int | None:
    """The parameter count of the GGUF at ``path`` (an engine has it as ``n_params`` from its
    load); None when the file is missing or unreadable."""
    try:
        return read_gguf(path).n_params or None
    except (GGUFError, OSError):
        return None
