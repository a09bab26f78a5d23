"""The remote client against a scripted server on loopback: what goes over the wire, retries,
timeouts, stop, and the breaker's bookkeeping."""

from __future__ import annotations

import threading

import pytest
from fault_server import Drop, FaultServer, RawBytes, Stall, Status, Stream, chunk, reply
from remote_fixtures import settings_for

from localchat.engine.options import Sampling
from localchat.events import Done, Failed, Notice, Token
from localchat.remote.client import RemoteClient, RemoteOff
from localchat.settings.remote import RemoteSettings

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def run(server: FaultServer, **settings) -> list:
    client = RemoteClient(settings_for(server.base_url, **settings))
    return list(client.stream(MESSAGES, Sampling(max_tokens=32, seed=7), route_reason="test"))


def test_a_client_cannot_be_built_while_the_remote_is_off():
    with pytest.raises(RemoteOff):
        RemoteClient(RemoteSettings(mode="off", base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(RemoteOff):
        RemoteClient(RemoteSettings(mode="auto"))


def test_streams_tokens_then_done_with_usage_route_and_model():
    with FaultServer([reply("Hel", "lo", "!", usage=(11, 3))]) as server:
        events = run(server)
    assert [e.text for e in events if isinstance(e, Token)] == ["Hel", "lo", "!"]
    done = events[-1]
    assert isinstance(done, Done) and done.reply == "Hello!" and done.finish_reason == "stop"
    t = done.timings
    assert (t.prompt_n, t.predicted_n) == (11, 3)
    assert (t.route, t.route_reason, t.model) == ("remote", "test", "fault-model")
    assert t.ttft_ms > 0 and t.itl_p95_ms >= t.itl_p50_ms >= 0


def test_the_request_asks_for_a_stream_with_usage_and_standard_sampling_only():
    with FaultServer([reply("ok")]) as server:
        run(server, model="big-model", max_tokens=99)
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    body = request.body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == MESSAGES and body["model"] == "big-model"
    assert body["max_tokens"] == 99 and body["seed"] == 7
    assert not {"top_k", "min_p", "repeat_penalty"} & body.keys()


def test_without_usage_the_token_count_is_the_number_of_text_chunks():
    with FaultServer([reply("a", "b")]) as server:
        done = run(server)[-1]
    assert done.timings.predicted_n == 2 and done.timings.prompt_n == 0


def test_a_length_cut_is_reported_as_length():
    stream = Stream([chunk("a"), chunk(finish_reason="length"), "[DONE]"])
    with FaultServer([stream]) as server:
        assert run(server)[-1].finish_reason == "length"


def test_a_500_before_the_first_token_is_retried_once_with_a_notice():
    with FaultServer([Status(500, "overloaded"), reply("fine")]) as server:
        events = run(server)
    assert len(server.requests) == 2
    assert isinstance(events[0], Notice) and events[0].kind == "retry"
    assert "500" in events[0].message
    assert events[-1] == Done("fine", "stop", events[-1].timings)


def test_two_failures_end_in_one_failed_line_after_exactly_two_requests():
    with FaultServer([Status(500, "overloaded")]) as server:
        events = run(server)
    assert len(server.requests) == 2
    assert isinstance(events[-1], Failed)
    assert events[-1].message == "remote answered 500: overloaded"


def test_a_client_error_is_not_retried_and_says_where_the_key_comes_from():
    with FaultServer([Status(401, "invalid api key")]) as server:
        events = run(server, api_key_env="LOCALCHAT_TEST_REMOTE_KEY")
    assert len(server.requests) == 1
    assert events == [Failed("remote answered 401: invalid api key (check the key in "
                             "$LOCALCHAT_TEST_REMOTE_KEY)")]


def test_a_drop_after_the_first_token_is_not_retried():
    with FaultServer([Stream([chunk("partial"), Drop()]), reply("never")]) as server:
        events = run(server)
    assert len(server.requests) == 1
    assert [type(e) for e in events] == [Token, Failed]
    assert "dropped" in events[-1].message


def test_a_drop_before_the_first_token_is_retried():
    with FaultServer([Stream([Drop()]), reply("second try")]) as server:
        events = run(server)
    assert len(server.requests) == 2
    assert events[-1].reply == "second try"


def test_a_stream_that_ends_without_finishing_is_an_error():
    with FaultServer([Stream([chunk("half")])]) as server:
        events = run(server)
    assert "before the reply was complete" in events[-1].message


def test_an_error_object_inside_a_200_stream_is_reported():
    stream = Stream(['{"error": {"message": "context length exceeded"}}'])
    with FaultServer([stream]) as server:
        events = run(server)
    assert len(server.requests) == 2  # nothing arrived yet: worth one retry
    assert events[-1] == Failed("remote error: context length exceeded")


def test_malformed_sse_is_an_error_and_not_retried():
    stream = Stream([chunk("ok"), RawBytes(b"data: {not json\n\n")])
    with FaultServer([stream]) as server:
        events = run(server)
    assert len(server.requests) == 1
    assert "malformed" in events[-1].message


def test_comment_lines_and_unknown_fields_are_ignored():
    stream = Stream([RawBytes(b": ping\n\nevent: message\n"), chunk("fine"),
                     chunk(finish_reason="stop"), "[DONE]"])
    with FaultServer([stream]) as server:
        assert run(server)[-1].reply == "fine"


def test_a_stalled_stream_fails_after_timeout_s_without_bytes():
    with FaultServer([Stream([chunk("thinking"), Stall()])]) as server:
        events = run(server, timeout_s=0.3)
    assert events[-1] == Failed("the remote sent nothing for 0.3 s (timeout_s)")
    assert len(server.requests) == 1  # a token had arrived: no retry


def test_stop_closes_the_connection_mid_stall_and_ends_with_done_aborted():
    with FaultServer([Stream([chunk("one"), chunk(" two"), Stall()])]) as server:
        # timeout_s is long: only stop() can end this turn while the test is running.
        client = RemoteClient(settings_for(server.base_url, timeout_s=60))
        turn = client.stream(MESSAGES)
        events = iter(turn)
        assert [next(events).text, next(events).text] == ["one", " two"]
        assert server.stall_started.wait(10)
        turn.stop()
        final = next(events)
        assert server.client_closed_during_stall.wait(10)  # the server saw the close
    assert isinstance(final, Done) and final.finish_reason == "aborted" and final.reply == "one two"
    assert list(events) == []


def test_stop_from_another_thread_before_any_byte_arrives():
    with FaultServer([Stream([Stall()])]) as server:
        client = RemoteClient(settings_for(server.base_url, timeout_s=60))
        turn = client.stream(MESSAGES)
        stopper = threading.Thread(target=lambda: (server.stall_started.wait(10), turn.stop()))
        stopper.start()
        events = list(turn)
        stopper.join()
        assert server.client_closed_during_stall.wait(10)
    assert events == [Done("", "aborted", events[0].timings)]


def test_the_breaker_learns_each_turn_and_a_stopped_turn_teaches_nothing():
    script = [Status(503), Status(503), Stream([Stall()]), reply("up again")]
    with FaultServer(script) as server:
        client = RemoteClient(settings_for(server.base_url, breaker_failures=5, timeout_s=60))
        list(client.stream(MESSAGES))
        assert client.breaker.status().consecutive_failures == 1  # one turn, two requests
        stopped = client.stream(MESSAGES)
        assert server.stall_started.wait(10)
        stopped.stop()
        assert list(stopped)[-1].finish_reason == "aborted"
        assert client.breaker.status().consecutive_failures == 1
        list(client.stream(MESSAGES))
        assert client.breaker.status().consecutive_failures == 0
