"""The [tools] section of config.toml: built-ins off until listed, the limits, and "always allow"
saved per server and tool without losing the user's comments."""

from __future__ import annotations

import pytest

from localchat import paths
from localchat.errors import ConfigError
from localchat.settings import RemoteSettings, Settings, load_config
from localchat.settings.tools import (
    SERVE_KEY_ENV,
    ToolsSettings,
    save_always_allow,
    secret_env_names,
)


def test_tools_are_off_and_limited_by_default():
    tools = load_config().tools
    assert tools == ToolsSettings() == Settings().tools
    assert tools.builtins == () and tools.always_allow == {}
    assert (tools.max_rounds, tools.timeout_s) == (8, 60.0)


def test_the_section_is_read_as_typed_immutable_values():
    paths.config_file().write_text(
        '[tools]\nbuiltins = ["read_file", "run_command"]\nmax_rounds = 3\ntimeout_s = 5\n'
        'max_result_chars = 2000\n\n[tools.always_allow]\nfilesystem = ["read_file"]\n'
        'builtin = ["*"]\n')
    tools = load_config().tools
    assert tools.builtins == ("read_file", "run_command")
    assert (tools.max_rounds, tools.timeout_s, tools.result_chars(32768)) == (3, 5.0, 2000)
    assert tools.always_allow == {"filesystem": ("read_file",), "builtin": ("*",)}
    assert tools.always_allowed("filesystem", "read_file")
    assert not tools.always_allowed("filesystem", "write_file")
    assert tools.always_allowed("builtin", "run_command")


def test_the_result_cap_follows_the_context_unless_set():
    tools = ToolsSettings()
    assert tools.result_chars(8192) == 8192  # a quarter of the context, ~4 characters a token
    assert tools.result_chars(512) == 1000
    assert tools.result_chars(None) == 16_000


@pytest.mark.parametrize("text, message", [
    ('[tools]\nbuiltins = ["read_files"]\n', "config.toml:2: tools.builtins names no built-in tool "
                                             "'read_files' (the built-ins are read_file"),
    ('[tools]\nbuiltins = "read_file"\n', "config.toml:2: tools.builtins must be a list of strings"),
    ('[tools]\ntimeout_s = 0\n', "config.toml:2: tools.timeout_s must be more than 0"),
    ('[tools]\nmax_rounds = 0\n', "config.toml:2: tools.max_rounds must be at least 1, not 0"),
    ('[tools.always_allow]\nfilesystem = "read_file"\n',
     "tools.always_allow must be a table of lists of strings"),
    ('[tools]\nrounds = 2\n', "unknown key 'rounds' in [tools]"),
])
def test_mistakes_are_one_line_errors_naming_file_and_line(text, message):
    paths.config_file().write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert message in str(caught.value)


def test_saving_always_allow_keeps_the_users_comments_and_other_settings():
    path = paths.config_file()
    path.write_text('# my settings\ndefault_model = "qwen2.5-7b"  # the big one\n\n'
                    '[tools]\nbuiltins = ["read_file"]  # only reading\n\n'
                    '[tools.always_allow]\nfilesystem = ["read_file"]  # safe\n\n'
                    '[sampling]\ntemperature = 0.2\n')
    save_always_allow("filesystem", "list_directory")
    save_always_allow("my server", "search")
    save_always_allow("filesystem", "list_directory")  # twice: still once
    text = path.read_text()
    assert text.startswith('# my settings\ndefault_model = "qwen2.5-7b"  # the big one\n')
    assert 'builtins = ["read_file"]  # only reading' in text
    assert 'filesystem = ["read_file", "list_directory"]  # safe' in text
    config = load_config()
    assert config.tools.always_allow == {"filesystem": ("read_file", "list_directory"),
                                         "my server": ("search",)}
    assert config.sampling.temperature == 0.2 and config.default_model == "qwen2.5-7b"


def test_saving_always_allow_creates_the_file_when_there_is_none():
    assert not paths.config_file().exists()
    save_always_allow("builtin", "read_file")
    assert load_config().tools.always_allow == {"builtin": ("read_file",)}


def test_saving_into_a_malformed_file_is_a_one_line_error_and_leaves_it_alone():
    path = paths.config_file()
    path.write_text("[tools\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        save_always_allow("builtin", "read_file")
    assert path.read_text() == "[tools\n"


def test_localchats_secrets_are_the_remote_key_variable_and_serves():
    names = secret_env_names(RemoteSettings(api_key_env="MY_OPENAI_KEY"))
    assert names == {"MY_OPENAI_KEY", "LOCALCHAT_REMOTE_API_KEY", SERVE_KEY_ENV}
