"""[remote] settings: off by default, validated once, the API key only ever in the environment."""

from __future__ import annotations

import pytest

from localchat.errors import ConfigError
from localchat.settings import parse_settings
from localchat.settings.remote import RemoteSettings


def remote(section: dict) -> RemoteSettings:
    return parse_settings({"remote": section}).remote


def test_an_empty_section_means_off_and_disabled():
    settings = remote({})
    assert settings == RemoteSettings()
    assert settings.mode == "off"
    assert not settings.enabled


def test_mode_without_base_url_is_not_enabled():
    assert not remote({"mode": "auto"}).enabled


def test_mode_and_base_url_enable_the_remote():
    settings = remote({"mode": "ask", "base_url": "http://127.0.0.1:9/v1/"})
    assert settings.enabled
    assert settings.chat_url == "http://127.0.0.1:9/v1/chat/completions"


def test_a_misspelled_key_is_refused_with_the_nearest_name():
    with pytest.raises(ConfigError, match=r"unknown key 'time_out_s' in \[remote\] "
                                          r"\(did you mean 'timeout_s'\?\)"):
        remote({"time_out_s": 5})


def test_a_key_written_into_the_config_is_refused_with_a_one_line_hint():
    with pytest.raises(ConfigError) as excinfo:
        remote({"api_key": "sk-secret-in-file"})
    message = str(excinfo.value)
    assert "api_key_env" in message and "\n" not in message
    assert "sk-secret-in-file" not in message


@pytest.mark.parametrize("section, fragment", [
    ({"mode": "always"}, "mode"),
    ({"timeout_s": "ten"}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"base_url": "127.0.0.1:8000"}, "http://"),
    ({"base_url": "http://127.0.0.1:99999/v1"}, "port"),
    ({"router": 3}, "router"),
    ({"confidence": {"quantile": 1.5}}, "quantile"),
    ({"confidence": {"max_entropy": 0}}, "max_entropy"),
    ({"confidence": {"min_margin": 1.5}}, "min_margin"),
    ({"confidence": {"min_tokens": 0}}, "min_tokens"),
    ({"router": {"rule_score": -1}}, "rule_score"),
])
def test_bad_values_are_one_line_config_errors(section, fragment):
    with pytest.raises(ConfigError) as excinfo:
        remote(section)
    assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_thresholds_may_be_flat_or_in_sub_tables():
    flat = remote({"rule_score": 4, "low_prob": 0.2, "min_tokens": 8})
    nested = remote({"router": {"rule_score": 4}, "confidence": {"low_prob": 0.2, "min_tokens": 8}})
    assert flat.router.rule_score == nested.router.rule_score == 4.0
    assert flat.confidence.low_prob == nested.confidence.low_prob == 0.2
    assert flat.confidence.min_tokens == nested.confidence.min_tokens == 8


def test_the_early_decision_limits_are_settings_and_rule_score_defaults_to_the_models_size():
    default = remote({})
    assert default.router.rule_score is None  # router.rule_score_for picks it from the size
    assert (default.confidence.min_tokens, default.confidence.max_entropy,
            default.confidence.min_margin) == (16, 3.75, 0.15)
    nested = remote({"confidence": {"max_entropy": 3, "min_margin": 0.2}})
    assert (nested.confidence.max_entropy, nested.confidence.min_margin) == (3.0, 0.2)


def test_the_key_is_read_from_the_environment_when_asked_and_never_stored(monkeypatch):
    settings = remote({"api_key_env": "LOCALCHAT_TEST_KEY"})
    monkeypatch.delenv("LOCALCHAT_TEST_KEY", raising=False)
    assert settings.api_key() is None
    monkeypatch.setenv("LOCALCHAT_TEST_KEY", "sk-first")
    assert settings.api_key() == "sk-first"
    monkeypatch.setenv("LOCALCHAT_TEST_KEY", "sk-rotated")
    assert settings.api_key() == "sk-rotated"
    assert "sk-rotated" not in repr(settings)


def test_the_key_variable_has_a_default_name():
    assert RemoteSettings().api_key_env == "LOCALCHAT_REMOTE_API_KEY"
