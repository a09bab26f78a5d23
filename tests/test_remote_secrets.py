"""The API key goes in the Authorization header and nowhere else: not in files the app writes,
not in error messages, not in logs."""

from __future__ import annotations

import logging

from fault_server import FaultServer, Status, reply
from remote_fixtures import LocalFactory, confident, settings_for

from localchat.events import Failed
from localchat.remote.escalate import Escalator

KEY = "sk-test-4f9a2c7e1b8d-do-not-leak"
HARD = [{"role": "user", "content": "Prove that there are infinitely many primes, step by step."}]


def test_the_key_is_sent_as_a_bearer_token_read_at_request_time(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    monkeypatch.setenv("LOCALCHAT_TEST_REMOTE_KEY", KEY)
    with FaultServer([reply("one"), reply("two")]) as server:
        esc = Escalator.from_settings(settings_for(server.base_url,
                                                   api_key_env="LOCALCHAT_TEST_REMOTE_KEY"))
        list(esc.start_turn(HARD, LocalFactory([]), route="remote"))
        monkeypatch.setenv("LOCALCHAT_TEST_REMOTE_KEY", KEY + "-rotated")
        list(esc.start_turn(HARD, LocalFactory([]), route="remote"))
    auth = [r.headers.get("Authorization") for r in server.requests]
    assert auth == [f"Bearer {KEY}", f"Bearer {KEY}-rotated"]


def test_the_key_is_in_no_file_no_error_and_no_log(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    monkeypatch.setenv("LOCALCHAT_TEST_REMOTE_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    # A server that echoes the key back in its error, as some proxies do.
    script = [Status(401, f"invalid api key {KEY}"), Status(500, f"upstream rejected {KEY}"),
              Status(500), Status(500), Status(500), reply("finally")]
    with FaultServer(script) as server:
        esc = Escalator.from_settings(settings_for(server.base_url, breaker_failures=2,
                                                   api_key_env="LOCALCHAT_TEST_REMOTE_KEY"))
        events = []
        for _ in range(4):
            events += esc.start_turn(HARD, LocalFactory(confident(" local", 3)), route="remote")
            events += esc.start_turn(HARD, LocalFactory(confident(" local", 3)))
    failures = [e.message for e in events if isinstance(e, Failed)]
    assert failures and all(KEY not in message for message in failures)
    assert any("***" in message for message in failures)
    assert all(KEY not in str(event) for event in events)
    assert KEY not in caplog.text
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written  # the breaker's state file at least
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
