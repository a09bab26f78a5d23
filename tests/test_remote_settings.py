"""[remote] settings: off by default, validated once, the API key only ever in the environment."""

from __future__ import annotations

import pytest

from localchat.errors import ConfigError
from localchat.remote.settings import RemoteSettings


def test_an_empty_section_means_off_and_disabled():
    settings = RemoteSettings.from_config({})
    assert settings.mode == "off"
    assert not settings.enabled


def test_mode_without_base_url_is_not_enabled():
    assert not RemoteSettings.from_config({"mode": "auto"}).enabled


def test_mode_and_base_url_enable_the_remote():
    settings = RemoteSettings.from_config({"mode": "ask", "base_url": "http://127.0.0.1:9/v1/"})
    assert settings.enabled
    assert settings.chat_url == "http://127.0.0.1:9/v1/chat/completions"


def test_keys_of_other_features_in_the_section_are_ignored():
    settings = RemoteSettings.from_config({"enabled": False, "something_new": 1, "mode": "auto",
                                           "base_url": "http://127.0.0.1:9/v1"})
    assert settings.mode == "auto"


def test_a_key_written_into_the_config_is_refused_with_a_one_line_hint():
    with pytest.raises(ConfigError) as excinfo:
        RemoteSettings.from_config({"api_key": "sk-secret-in-file"})
    message = str(excinfo.value)
    assert "api_key_env" in message and "\n" not in message
    assert "sk-secret-in-file" not in message


@pytest.mark.parametrize("section, fragment", [
    ({"mode": "always"}, "mode"),
    ({"timeout_s": "ten"}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"base_url": "127.0.0.1:8000"}, "http://"),
    ({"router": 3}, "router"),
    ({"confidence": {"quantile": 1.5}}, "quantile"),
    ({"confidence": {"max_entropy": 0}}, "max_entropy"),
    ({"confidence": {"min_margin": 1.5}}, "min_margin"),
    ({"confidence": {"min_tokens": 0}}, "min_tokens"),
    ({"router": {"rule_score": -1}}, "rule_score"),
])
def test_bad_values_are_one_line_config_errors(section, fragment):
    with pytest.raises(ConfigError) as excinfo:
        RemoteSettings.from_config(section)
    assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_thresholds_may_be_flat_or_in_sub_tables():
    flat = RemoteSettings.from_config({"rule_score": 4, "low_prob": 0.2, "min_tokens": 8})
    nested = RemoteSettings.from_config({"router": {"rule_score": 4},
                                         "confidence": {"low_prob": 0.2, "min_tokens": 8}})
    assert flat.router.rule_score == nested.router.rule_score == 4.0
    assert flat.confidence.low_prob == nested.confidence.low_prob == 0.2
    assert flat.confidence.min_tokens == nested.confidence.min_tokens == 8


def test_the_early_decision_limits_are_settings_and_rule_score_defaults_to_the_models_size():
    default = RemoteSettings.from_config({})
    assert default.router.rule_score is None  # router.rule_score_for picks it from the size
    assert (default.confidence.min_tokens, default.confidence.max_entropy,
            default.confidence.min_margin) == (16, 3.75, 0.15)
    nested = RemoteSettings.from_config({"confidence": {"max_entropy": 3, "min_margin": 0.2}})
    assert (nested.confidence.max_entropy, nested.confidence.min_margin) == (3.0, 0.2)


def test_the_key_is_read_from_the_environment_when_asked_and_never_stored(monkeypatch):
    settings = RemoteSettings.from_config({"api_key_env": "LOCALCHAT_TEST_KEY"})
    monkeypatch.delenv("LOCALCHAT_TEST_KEY", raising=False)
    assert settings.api_key() is None
    monkeypatch.setenv("LOCALCHAT_TEST_KEY", "sk-first")
    assert settings.api_key() == "sk-first"
    monkeypatch.setenv("LOCALCHAT_TEST_KEY", "sk-rotated")
    assert settings.api_key() == "sk-rotated"
    assert "sk-rotated" not in repr(settings)
