"""config.toml: defaults, overlay, open sections, precise errors, atomic minimal writes."""

from __future__ import annotations

import tomllib

import pytest

from localchat import paths
from localchat.config import DEFAULT_MODEL, Config, load_config, save_config
from localchat.errors import ConfigError


def write_config(text: str):
    path = paths.config_file()
    path.write_text(text)
    return path


def test_missing_file_means_all_defaults():
    config = load_config()

    assert config.default_model == DEFAULT_MODEL == "smollm2-135m"
    assert config.engine["gpu_layers"] == "auto"
    assert set(config.engine) >= {"n_ctx", "gpu_layers", "n_batch", "n_ubatch", "n_threads",
                                  "flash_attn", "kv_type"}
    assert config.raw == {}


def test_file_values_overlay_defaults_and_unknown_keys_are_kept():
    write_config('default_model = "qwen2.5-7b"\n'
                 '[engine]\nn_ctx = 8192\nfuture_knob = "x"\n'
                 '[sampling]\ntemperature = 1\n'
                 '[my_feature]\nenabled = true\n')

    config = load_config()

    assert config.default_model == "qwen2.5-7b"
    assert config.engine["n_ctx"] == 8192
    assert config.engine["n_batch"] == 512  # untouched default
    assert config.engine["future_knob"] == "x"
    assert config.sampling["temperature"] == 1
    assert config.section("my_feature") == {"enabled": True}
    assert config.raw["my_feature"] == {"enabled": True}


def test_malformed_toml_names_file_and_line():
    path = write_config('default_model = "a"\n[engine]\nn_ctx = = 3\n')

    with pytest.raises(ConfigError) as error:
        load_config()

    assert str(error.value).startswith(f"{path}:3: invalid TOML")
    assert "\n" not in str(error.value)


def test_wrong_type_names_file_line_and_key():
    path = write_config('[engine]\nn_batch = 512\nn_ctx = "big"\n')

    with pytest.raises(ConfigError, match=rf"^{path}:3: engine.n_ctx must be an integer"):
        load_config()


@pytest.mark.parametrize("value", ['"auto"', "0", "33"])
def test_gpu_layers_takes_auto_or_a_count(value):
    write_config(f"[engine]\ngpu_layers = {value}\n")

    assert load_config().engine["gpu_layers"] == tomllib.loads(f"v = {value}")["v"]


def test_gpu_layers_rejects_other_words():
    write_config('[engine]\ngpu_layers = "max"\n')

    with pytest.raises(ConfigError, match='gpu_layers must be "auto" or a number of layers'):
        load_config()


def test_save_writes_only_changes_and_keeps_what_the_file_had():
    write_config('[remote]\nbase_url = "http://gpu-box:8080/v1"\n[my_feature]\nlevel = 3\n')
    config = load_config()
    config.engine["n_ctx"] = 16384

    path = save_config(config)

    written = tomllib.loads(path.read_text())
    assert written == {"engine": {"n_ctx": 16384},
                       "remote": {"base_url": "http://gpu-box:8080/v1"},
                       "my_feature": {"level": 3}}
    assert load_config().engine["n_ctx"] == 16384
    assert list(path.parent.glob(".config.toml.*")) == []  # no temp file left behind


def test_saving_defaults_writes_an_empty_file():
    path = save_config(Config())

    assert tomllib.loads(path.read_text()) == {}
