"""config.toml: one typed schema with its defaults, overlay, precise errors for every mistake."""

from __future__ import annotations

import dataclasses
import re
import tomllib

import pytest

from localchat import paths
from localchat.context.budget import ContextSettings
from localchat.context.factory import context_settings
from localchat.engine.factory import engine_options, sampling_options
from localchat.engine.options import EngineOptions, Sampling
from localchat.errors import ConfigError
from localchat.models.registry import ModelSpec
from localchat.settings import DEFAULT_MODEL, Settings, load_config


def write_config(text: str):
    path = paths.config_file()
    path.write_text(text)
    return path


def test_missing_file_means_all_defaults():
    config = load_config()

    assert config == Settings()
    assert config.default_model == DEFAULT_MODEL == "smollm2-135m"
    assert config.engine.gpu_layers == "auto"
    assert config.sampling.max_tokens == 1024
    assert config.remote.mode == "off"
    assert config.snapshots.enabled


def test_file_values_overlay_defaults_as_typed_attributes():
    write_config('default_model = "qwen2.5-7b"\n'
                 '[engine]\nn_ctx = 8192\n'
                 '[sampling]\ntemperature = 1\n'
                 '[snapshots]\nenabled = false\n')

    config = load_config()

    assert config.default_model == "qwen2.5-7b"
    assert config.engine.n_ctx == 8192
    assert config.engine.n_batch == 512  # untouched default
    assert config.sampling.temperature == 1.0 and isinstance(config.sampling.temperature, float)
    assert config.snapshots.enabled is False


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_config().engine.n_ctx = 1  # type: ignore[misc]


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


@pytest.mark.parametrize("value", ['"auto"', '"all"', "0", "33"])
def test_gpu_layers_takes_auto_all_or_a_count(value):
    write_config(f"[engine]\ngpu_layers = {value}\n")

    assert load_config().engine.gpu_layers == tomllib.loads(f"v = {value}")["v"]


def test_gpu_layers_all_reaches_the_engine_options():
    write_config('[engine]\ngpu_layers = "all"\n')

    assert engine_options(ModelSpec(name="m"), load_config()).gpu_layers == "all"


def test_gpu_layers_rejects_other_words():
    write_config('[engine]\ngpu_layers = "max"\n')

    with pytest.raises(ConfigError, match='gpu_layers must be "auto" or "all" or an integer'):
        load_config()


@pytest.mark.parametrize("text, line, says", [
    ('[engine]\nkv_type = "f16"\nfuture_knob = 1\n', 3, "unknown key 'future_knob' in [engine] (valid keys: n_ctx,"),
    ('[sampling]\ntemprature = 0\n', 2, "unknown key 'temprature' in [sampling] (did you mean 'temperature'?)"),
    ('[my_feature]\nenabled = true\n', 1, "unknown section [my_feature]"),
    ('[remote.routr]\nrule_score = 2\n', 1, "unknown key 'routr' in [remote] (did you mean 'router'?)"),
    ('[context]\nsummarize = true\ntrim_fraction = 1.5\n', 3, "context.trim_fraction must be in [0, 1), not 1.5"),
    ('[sampling]\nthinking = "maybe"\n', 2, 'sampling.thinking must be "auto" or "on" or "off"'),
    ('[engine]\nkv_type = "q5"\n', 2, 'engine.kv_type must be "f16" or "q8_0" or "q4_0"'),
    ('engine = 3\n', 1, "[engine] must be a table"),
])
def test_unknown_names_and_bad_values_name_file_line_and_key(text, line, says):
    path = write_config(text)

    with pytest.raises(ConfigError) as error:
        load_config()

    assert str(error.value).startswith(f"{path}:{line}: ")
    assert says in str(error.value)


def test_the_engines_own_defaults_are_the_schemas():
    """EngineOptions and Sampling keep defaults for code that builds an engine directly; they
    must be the ones config.toml documents."""
    spec = ModelSpec(name="m", n_ctx=EngineOptions().n_ctx)

    assert engine_options(spec, Settings()) == EngineOptions()
    assert sampling_options(Settings()) == Sampling()


def test_the_context_budgets_defaults_are_the_schemas():
    defaults = ContextSettings.for_reply(4096, 1024)

    assert context_settings(Settings().context, 4096, 1024) == defaults


def test_precedence_is_config_then_registry_entry_then_flags():
    write_config('[engine]\nn_ctx = 8192\ngpu_layers = 4\nchat_format = "chatml"\n'
                 '[sampling]\nseed = 7\nmax_tokens = 64\n')
    config = load_config()
    spec = ModelSpec(name="m", n_ctx=2048, gpu_layers=10)

    options = engine_options(spec, config, n_ctx=None, kv_type="q8_0")
    sampling = sampling_options(config, max_tokens=None, temperature=0.0)

    assert (options.n_ctx, options.gpu_layers, options.chat_format, options.kv_type) == \
        (8192, 10, "chatml", "q8_0")
    assert (sampling.seed, sampling.max_tokens, sampling.temperature) == (7, 64, 0.0)
    assert sampling_options(Settings()).seed == -1  # -1 in the file: random
    assert engine_options(spec, Settings()).n_ctx == 2048  # 0 in the file: the registry's


def test_the_serve_section_is_checked_like_every_other(tmp_path):
    from localchat.settings import SERVE_PORT

    path = tmp_path / "config.toml"
    assert load_config(path).serve.port == SERVE_PORT not in (11434, 1234, 8080, 8000)
    path.write_text('[serve]\nport = 9000\ncors_origins = ["http://localhost:3000"]\n')
    assert load_config(path).serve.cors_origins == ("http://localhost:3000",)
    for text, says in (('[serve]\nport = 70000\n', "serve.port must be in [0, 65535]"),
                       ('[serve]\ncors_origins = "x"\n', "must be a list of strings"),
                       ('[serve]\ncache_ram = 1\n', "did you mean 'cache_ram_mib'?")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_config(path)
