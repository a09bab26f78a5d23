"""Many clients at once against ``localchat serve`` (issue 41, item 6), on real sockets with the
real model: arrival order, no stream cut by a newer one, 503 with Retry-After beyond
``max_queue``, a disconnect stopping the decode within a token with the cache kept, a queued
request whose client left dropped before it runs, and model switches after the requests before
them."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest
from serve_fixtures import MODEL, post, raw, read_response, running

pytestmark = pytest.mark.model

STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake."}]


def wait_idle(app, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not app.scheduler.idle:
        assert time.monotonic() < deadline, "the server stayed busy"
        time.sleep(0.02)


def open_stream(app, messages=STORY, max_tokens: int = 400, model: str = MODEL) -> socket.socket:
    """A streamed chat request on a raw socket, its head and first chunk read."""
    sock = socket.create_connection(("127.0.0.1", app.port), timeout=30)
    sock.sendall(post("/v1/chat/completions", {
        "model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
        "temperature": 0, "repeat_penalty": 1.0}))
    return sock


def first_events(sock: socket.socket, n: int) -> bytes:
    data = b""
    while data.count(b"data: ") < n:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def rest_of_stream(sock: socket.socket) -> bytes:
    data = b""
    while b"data: [DONE]" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_concurrent_streams_all_complete_and_start_in_arrival_order(serve_host):
    with running(serve_host) as app:
        client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=0)
        results: dict[int, dict] = {}

        def stream(i: int) -> None:
            first, finish = None, None
            for chunk in client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Say the number {i}."}],
                    max_tokens=6, temperature=0, stream=True):
                if chunk.choices and chunk.choices[0].delta.content and first is None:
                    first = time.monotonic()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            results[i] = {"first": first, "finish": finish}

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(5)]
        for thread in threads:  # one after another, so their arrival order is known
            thread.start()
            time.sleep(0.15)
        for thread in threads:
            thread.join(60)

    assert sorted(results) == list(range(5))
    assert all(r["finish"] in ("stop", "length") for r in results.values())  # none cut
    starts = [results[i]["first"] for i in range(5)]
    assert starts == sorted(starts)  # started in the order they arrived


def test_a_disconnect_stops_the_decode_within_a_token_and_keeps_the_cache(serve_host):
    with running(serve_host) as app:
        sock = open_stream(app)
        received = first_events(sock, 4).count(b'"content"') - 1  # less the role chunk
        sock.close()
        wait_idle(app)
        reply = serve_host.engine.cached_messages()[-1]
        assert reply.open and len(reply.tokens) <= received + 4  # stopped, not run to 400

        status, _, body = raw(app, post("/v1/chat/completions", {
            "model": MODEL, "messages": STORY, "max_tokens": 2, "temperature": 0}))
        usage = json.loads(body)["usage"]
        assert status == 200
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_beyond_max_queue_503_and_a_queued_request_whose_client_left_never_runs(serve_host):
    with running(serve_host, max_queue=1) as app:
        slots = app.scheduler.parallel
        running_ones = [open_stream(app, [{"role": "user", "content": f"Story {i}: a dragon."}])
                        for i in range(slots)]
        for sock in running_ones:  # every slot streams
            first_events(sock, 2)
        left = open_stream(app, [{"role": "user", "content": "never answered"}])
        time.sleep(0.2)
        left.close()  # it was waiting: dropped before it runs
        time.sleep(0.2)
        waiting = open_stream(app, [{"role": "user", "content": "Hi"}], max_tokens=2)
        time.sleep(0.2)

        status, headers, body = raw(app, post("/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "one too many"}]}))
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert json.loads(body)["error"]["code"] == "queue_full"

        running_ones[0].close()
        status, _, answer = read_response(waiting)
        assert status == 200 and b"data: [DONE]" in answer
        waiting.close()
        for sock in running_ones[1:]:
            sock.close()
        wait_idle(app)
        assert app.scheduler.dropped == 1
        assert app.scheduler.served == slots + 1


def test_a_request_for_another_model_switches_after_the_requests_before_it(test_model_path,
                                                                              isolated_home):
    from localchat import paths
    from localchat.serve.model_host import ModelHost
    from localchat.settings import Settings

    paths.user_registry_file().parent.mkdir(parents=True, exist_ok=True)
    paths.user_registry_file().write_text(
        f'[models.alpha]\npath = "{test_model_path}"\nquant = "Q4_1"\n'
        f'[models.beta]\npath = "{test_model_path}"\n')
    host = ModelHost(Settings(default_model="alpha"), n_ctx=512, cache_bytes=16 * 1024**2)
    try:
        with running(host) as app:
            client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=0)
            assert {m.id for m in client.models.list().data} >= {"alpha", "beta"}
            before = open_stream(app, max_tokens=24, model="alpha")
            first_events(before, 2)
            after = client.chat.completions.create(
                model="beta", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            streamed = rest_of_stream(before)  # it had run to its end first
            assert b'"finish_reason": "length"' in streamed or b'"finish_reason": "stop"' in streamed
            assert after.model == "beta" and host.loaded.name == "beta"
            again = client.chat.completions.create(
                model="alpha:q4_1", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            assert again.model == "alpha" and host.loaded.name == "alpha"
            before.close()
    finally:
        host.unload()


def test_a_streamed_reply_decodes_on_once_its_first_text_was_sent(serve_host, monkeypatch):
    from localchat.engine.turn import TurnHandle
    from localchat.serve import scheduler

    # A hold far beyond any wait for the event loop: the reply goes on only because it was told.
    monkeypatch.setattr(scheduler, "FIRST_TEXT_HOLD_S", 30.0)
    seen: list[str] = []
    emit, shown, hold = TurnHandle.emit, TurnHandle.first_text_shown, TurnHandle.hold_first_text

    def spy_emit(self, event):
        emit(self, event)
        if getattr(event, "text", ""):
            seen.append("emitted")

    def spy_shown(self):
        seen.append("shown")
        shown(self)

    def spy_hold(self, timeout_s):
        seen.append("held")
        hold(self, timeout_s)

    monkeypatch.setattr(TurnHandle, "hold_first_text", spy_hold)
    monkeypatch.setattr(TurnHandle, "emit", spy_emit)
    monkeypatch.setattr(TurnHandle, "first_text_shown", spy_shown)
    with running(serve_host) as app:
        sock = open_stream(app, max_tokens=8)
        rest_of_stream(sock)
        sock.close()
        wait_idle(app)
        streamed, seen[:] = list(seen), []
        status, _, _ = raw(app, post("/v1/chat/completions", {
            "model": MODEL, "messages": STORY, "max_tokens": 8, "temperature": 0}))

    # The first text's emit returned after the loop had sent it; a reply not streamed is never
    # held (its client sees nothing before its end).
    assert streamed[:3] == ["held", "shown", "emitted"] and streamed.count("shown") == 1
    assert status == 200 and "held" not in seen and seen.count("emitted") >= 1
