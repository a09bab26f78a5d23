"""The circuit breaker: down after repeated failed turns, a probe after the cool-down."""

from __future__ import annotations

import json

from localchat.remote.breaker import CircuitBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_the_threshold_of_consecutive_failures():
    breaker = CircuitBreaker(3, 60, clock=FakeClock())
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.allows_request()
    breaker.record_failure()
    assert not breaker.allows_request()
    assert breaker.status().state == "open"
    assert "3 failed turns" in breaker.describe()


def test_a_success_resets_the_count():
    breaker = CircuitBreaker(2, 60, clock=FakeClock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.status().state == "closed"


def test_after_the_cooldown_one_probe_decides():
    clock = FakeClock()
    breaker = CircuitBreaker(1, 60, clock=clock)
    breaker.record_failure()
    clock.now += 61
    assert breaker.status().state == "half-open" and breaker.allows_request()
    breaker.record_failure()  # the probe failed: down for another cool-down
    assert breaker.status().state == "open"
    clock.now += 61
    breaker.record_success()
    assert breaker.status().state == "closed"


def test_state_is_shared_through_the_file_and_holds_no_credentials(tmp_path):
    state = tmp_path / "remote_breaker.json"
    url = "https://user:hunter2@api.example.test/v1"
    first = CircuitBreaker(2, 60, state_file=state, base_url=url, clock=FakeClock())
    first.record_failure()
    first.record_failure()
    second = CircuitBreaker(2, 60, state_file=state, base_url=url, clock=FakeClock())
    assert second.status().state == "open"
    text = state.read_text()
    assert "hunter2" not in text and "user" not in text
    assert json.loads(text)["server"] == "https://api.example.test/v1"


def test_state_of_another_server_is_ignored(tmp_path):
    state = tmp_path / "remote_breaker.json"
    down = CircuitBreaker(1, 60, state_file=state, base_url="http://a.test/v1", clock=FakeClock())
    down.record_failure()
    other = CircuitBreaker(1, 60, state_file=state, base_url="http://b.test/v1", clock=FakeClock())
    assert other.status().state == "closed"


def test_a_damaged_state_file_is_ignored(tmp_path):
    state = tmp_path / "remote_breaker.json"
    state.write_text("{not json")
    assert CircuitBreaker(1, 60, state_file=state).status().state == "closed"
