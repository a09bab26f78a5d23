"""A GGUF with fill-in-the-middle tokens for the completion tests: the test model (SmolLM2, which
has none llama.cpp recognises) with ``tokenizer.ggml.fim_*_token_id`` added to its metadata by
llama.cpp's ``gguf`` package, pointing at unused special tokens of its vocabulary. Written once
into the test cache, under a temporary name renamed when complete."""

from __future__ import annotations

import os
from pathlib import Path

# SmolLM2's special tokens 3, 5..9 (<repo_name>, <file_sep>, <filename>, <gh_stars>,
# <issue_start>, <issue_comment>): never in a chat, so any id will do.
FIM_IDS = {"pre": 6, "suf": 7, "mid": 8, "pad": 9, "rep": 3, "sep": 5}
FORMAT = 1  # part of the file name: a change to what is written gets a new file


def with_fim_tokens(source: Path, out_dir: Path) -> Path:
    """``source`` with FIM_IDS in its metadata, written into ``out_dir`` once."""
    target = out_dir / f"{source.stem}-fim{FORMAT}.gguf"
    if target.is_file():
        return target
    import gguf

    out_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(partial, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for kind, token in FIM_IDS.items():
        writer.add_uint32(f"tokenizer.ggml.fim_{kind}_token_id", token)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    partial.rename(target)
    return target
