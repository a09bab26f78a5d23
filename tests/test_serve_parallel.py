"""``localchat serve`` answering several apps at once (issue 48, item 1) on real sockets with the
real model: chats from the ``openai`` SDK and the ``ollama`` library stream side by side on the
slots, each reply what a fresh prefill of its history gives; a completion joins the running
batch; 64 clients on 4 slots: the queue bound and 503 hold, no stream is cut, nothing leaks."""

from __future__ import annotations

import resource
import socket
import threading
import time

import ollama
import openai
import pytest
from oracle import assert_text_matches_fresh
from serve_fixtures import MODEL, post, read_response, running

from localchat.engine.options import Sampling

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0, "max_tokens": 16, "extra_body": {"repeat_penalty": 1.0}}


def wait_idle(app, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not app.scheduler.idle:
        assert time.monotonic() < deadline, "the server stayed busy"
        time.sleep(0.02)


def test_chats_from_two_client_libraries_stream_at_once_each_exact(serve_host, fresh):
    questions = ["What is the capital of Italy?", "Name a fruit.", "What colour is the sky?"]
    texts: dict[int, str] = {}
    with running(serve_host) as app:
        client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=0)
        before = serve_host.engine.gate_stats.shared

        def with_openai(i: int) -> None:
            chunks = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": questions[i]}], stream=True,
                **GREEDY)
            texts[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        def with_ollama() -> None:
            reply = ollama.Client(host=app.base_url).chat(
                model=MODEL, messages=[{"role": "user", "content": questions[2]}], stream=False,
                options={"temperature": 0, "num_predict": 16, "repeat_penalty": 1.0})
            texts[2] = reply.message.content

        threads = [threading.Thread(target=with_openai, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=with_ollama))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        wait_idle(app)
        assert app.scheduler.most_running >= 2
        assert serve_host.engine.gate_stats.shared > before  # decoded in shared batches
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=16)
    for i, question in enumerate(questions):
        assert_text_matches_fresh(texts[i], fresh, [{"role": "user", "content": question}],
                                  sampling)


def test_a_completion_joins_the_batch_while_chats_stream(serve_host):
    with running(serve_host) as app:
        client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=0)
        streaming = threading.Event()
        finishes: list[str] = []

        def chat(i: int) -> None:
            for chunk in client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Tell story {i}."}],
                    stream=True, temperature=0, max_tokens=60):
                if chunk.choices and chunk.choices[0].delta.content:
                    streaming.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finishes.append(chunk.choices[0].finish_reason)

        threads = [threading.Thread(target=chat, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        assert streaming.wait(60)
        completion = client.completions.create(model=MODEL, prompt="def add(a, b):\n    return",
                                               max_tokens=8, temperature=0)
        chats_running = sum(thread.is_alive() for thread in threads)
        for thread in threads:
            thread.join(120)
        assert completion.choices[0].finish_reason in ("stop", "length")
        assert completion.usage.completion_tokens >= 1
        assert chats_running >= 1  # it was answered while chats still streamed
        assert finishes == ["length"] * 3 or len(finishes) == 3


def test_64_clients_on_4_slots_get_a_stream_or_a_503_and_nothing_leaks(serve_host):
    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    with running(serve_host, max_queue=12) as app:
        slots = app.scheduler.parallel
        assert slots == 4
        threads_before = threading.active_count()
        rss_before = rss_mib()
        results: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        go = threading.Barrier(64)

        def client(i: int) -> None:
            go.wait()
            with socket.create_connection(("127.0.0.1", app.port), timeout=120) as sock:
                sock.sendall(post("/v1/chat/completions", {
                    "model": MODEL, "stream": True, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Say the word {i}."}]}))
                status, _, body = read_response(sock)
            with lock:
                results.append((status, body))

        clients = [threading.Thread(target=client, args=(i,)) for i in range(64)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(300)
        wait_idle(app)
        served = [body for status, body in results if status == 200]
        refused = [body for status, body in results if status == 503]
        assert len(results) == 64 and len(served) + len(refused) == 64
        assert len(served) >= slots + 12 and refused  # the bound held: the rest were told to retry
        assert all(b"data: [DONE]" in body and b'"finish_reason"' in body for body in served)
        assert all(b"queue_full" in body for body in refused)
        assert app.scheduler.served == len(served) and app.scheduler.most_running == slots
        time.sleep(0.5)
        assert threading.active_count() <= threads_before + 2  # job and slot threads ended
        assert rss_mib() - rss_before < 200
