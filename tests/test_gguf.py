"""The GGUF header reader: real model facts, synthetic files, and clear refusals."""

from __future__ import annotations

import struct

import pytest
from hub_server import make_gguf

from localchat.models.gguf import ArraySummary, GGUFError, parameter_count, read_gguf


@pytest.fixture(scope="module")
def smollm(test_model_path):
    return read_gguf(test_model_path)


def test_real_model_architecture_and_shape(smollm):
    assert smollm.version == 3
    assert smollm.architecture == "llama"
    assert smollm.n_layers == smollm.metadata["llama.block_count"] == 30
    assert smollm.context_length == 8192
    assert (smollm.embedding_length, smollm.n_heads, smollm.n_kv_heads) == (576, 9, 3)
    assert smollm.head_dim == smollm.value_head_dim == 64
    assert smollm.quantization == "Q4_1"


def test_real_model_has_a_chat_template(smollm):
    assert smollm.chat_template is not None
    assert "<|im_start|>" in smollm.chat_template


def test_real_model_tensor_sizes_account_for_the_whole_file(smollm):
    assert smollm.is_complete
    assert smollm.data_end == smollm.file_size  # block sizes of every ggml type add up exactly
    assert sorted(smollm.layer_bytes) == list(range(30))
    assert len(set(smollm.layer_bytes.values())) == 1  # identical blocks
    assert smollm.non_layer_bytes > 0  # the token embedding
    assert smollm.tensor_bytes == smollm.non_layer_bytes + 30 * smollm.layer_bytes[0]


def test_parameter_count_comes_from_the_tensor_table(smollm, test_model_path, tmp_path):
    # SmolLM2-135M's GGUF has no general.parameter_count; its size label says 135M.
    assert "general.parameter_count" not in smollm.metadata
    assert smollm.metadata["general.size_label"] == "135M"
    assert smollm.n_params == 134_515_008
    assert parameter_count(test_model_path) == smollm.n_params
    assert parameter_count(tmp_path / "missing.gguf") is None  # the router then uses its default
    (tmp_path / "not.gguf").write_bytes(b"nope")
    assert parameter_count(tmp_path / "not.gguf") is None


def test_kv_cache_cost_per_token(smollm):
    # 30 layers x 3 KV heads x (64 key + 64 value) dims x 2 bytes (f16)
    assert smollm.kv_bytes_per_token() == 30 * 3 * 128 * 2
    assert smollm.kv_bytes_per_token(bytes_per_element=1.0625) == int(30 * 3 * 128 * 1.0625)


def test_long_arrays_are_summarized_short_ones_decoded(smollm):
    assert smollm.metadata["tokenizer.ggml.tokens"] == ArraySummary(element_type=8, length=49152)
    assert len(smollm.metadata["tokenizer.ggml.tokens"]) == 49152
    assert smollm.metadata["general.languages"] == ["en"]


def test_version_2_files_are_read(tmp_path):
    path = tmp_path / "v2.gguf"
    path.write_bytes(make_gguf(version=2, n_layers=3, context_length=4096))

    info = read_gguf(path)

    assert (info.version, info.n_layers, info.context_length) == (2, 3, 4096)
    assert info.is_complete and info.name == "Fake Test Model"


def test_missing_template_is_none(tmp_path):
    path = tmp_path / "plain.gguf"
    path.write_bytes(make_gguf(chat_template=None))

    assert read_gguf(path).chat_template is None


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, long enough to have a header's worth of bytes\n")

    with pytest.raises(GGUFError, match="is not a GGUF model file"):
        read_gguf(path)


def test_unsupported_version_is_refused(tmp_path):
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))

    with pytest.raises(GGUFError, match="version 1"):
        read_gguf(path)


@pytest.mark.parametrize("keep", [10, 30, 2000])
def test_a_cut_header_is_reported_as_truncated(tmp_path, keep):
    path = tmp_path / "cut.gguf"
    path.write_bytes(make_gguf()[:keep])

    with pytest.raises(GGUFError, match="truncated"):
        read_gguf(path)


def test_cut_tensor_data_is_detected(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(make_gguf()[:-1000])

    info = read_gguf(path)

    assert not info.is_complete
    with pytest.raises(GGUFError, match=r"truncated: its tensors need \d+ bytes but the file has"):
        info.require_complete()


def test_missing_file_and_directory_are_user_errors(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        read_gguf(tmp_path / "absent.gguf")
    with pytest.raises(GGUFError, match="is a directory"):
        read_gguf(tmp_path)
