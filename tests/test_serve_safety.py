"""``localchat serve`` against hostile and broken requests (issue 41, item 7), on real sockets on
127.0.0.1: the Host check, CORS only for named origins, the key, the body cap, slow and half-sent
requests, 400s naming the field, context_length_exceeded with the numbers, and models that a
request can only name, never load from a path."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
from serve_fixtures import MODEL, get, post, raw, read_response, running

from localchat.serve.http import Limits

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(serve_host):
    with running(serve_host, limits=Limits(max_body_bytes=4096, request_timeout_s=1.0,
                                           idle_timeout_s=5.0)) as app:
        yield app


def error_of(body: bytes) -> dict:
    return json.loads(body)["error"]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8642", "127.0.0.1.evil.example",
                                  "10.0.0.5"])
def test_a_foreign_host_header_is_refused_before_anything_runs(server, host):
    status, _, body = raw(server, post(CHAT, HELLO, host=host))
    assert status == 403 and error_of(body)["code"] == "forbidden_host"


@pytest.mark.parametrize("host", ["localhost", "localhost:8642", "127.0.0.1:1", "[::1]:8642",
                                  "app.localhost"])
def test_loopback_names_pass_the_host_check(server, host):
    status, _, _ = raw(server, get("/v1/models", host=host))
    assert status == 200


def test_a_web_origin_is_refused_without_cors_headers_unless_named(serve_host, server):
    status, headers, body = raw(server, post(CHAT, HELLO, Origin="http://evil.example"))
    assert status == 403 and "--cors-origin http://evil.example" in error_of(body)["message"]
    assert not any(name.startswith("access-control") for name in headers)

    with running(serve_host, cors_origins=["http://localhost:3000"]) as app:
        status, headers, _ = raw(app, get("/v1/models", Origin="http://localhost:3000"))
        assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:3000"
        preflight = (b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n"
                     b"Connection: close\r\n\r\n")
        status, headers, _ = raw(app, preflight)
        assert status == 204 and "Authorization" in headers["access-control-allow-headers"]
        status, headers, _ = raw(app, get("/v1/models", Origin="http://other.example"))
        assert status == 403 and "access-control-allow-origin" not in headers


def test_with_a_key_only_the_right_bearer_passes(serve_host):
    with running(serve_host, api_key="s3cret") as app:
        for authorization in (None, "Bearer wrong", "Basic s3cret", "Bearer s3cret2"):
            extra = {"Authorization": authorization} if authorization else {}
            status, headers, body = raw(app, get("/v1/models", **extra))
            assert status == 401 and headers["www-authenticate"] == "Bearer"
            assert error_of(body)["code"] == "invalid_api_key"
        assert raw(app, get("/health"))[0] == 200  # probes need no key
        client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=app.base_url + "/v1", api_key="nope", max_retries=0).models.list()


def test_without_a_key_any_bearer_is_accepted(server):
    assert raw(server, get("/v1/models", Authorization="Bearer whatever-open-webui-sends"))[0] == 200


def test_a_body_over_the_cap_is_refused_before_it_is_read(server):
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {50 * 1024**2}\r\n\r\n").encode()
    status, _, body = raw(server, head)  # none of the 50 MB is ever sent
    assert status == 413 and "4096" in error_of(body)["message"]
    chunked = (f"POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
               f"{8000:x}\r\n").encode() + b"x" * 8000 + b"\r\n0\r\n\r\n"
    assert raw(server, chunked)[0] == 413


@pytest.mark.parametrize("partial", [b"POST /v1/chat/completions HTTP/1.1\r\nHost: local",
                                     post(CHAT, HELLO)[:-10]])
def test_slow_or_half_sent_requests_time_out_without_holding_others(server, partial):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as stuck:
        stuck.sendall(partial)
        started = time.monotonic()
        assert raw(server, get("/health"))[0] == 200  # served meanwhile
        status, _, _ = read_response(stuck)
        assert status == 408 and time.monotonic() - started < 5


def test_a_request_trickled_byte_by_byte_still_times_out(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        started = time.monotonic()
        for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
            if time.monotonic() - started > 3:
                break
        assert read_response(slow)[0] == 408


@pytest.mark.parametrize("body, param, says", [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    ({"model": MODEL}, "messages", "non-empty array"),
    ({"messages": []}, "messages", "non-empty array"),
    ({"messages": "hi"}, "messages", "must be an array"),
    ({"messages": ["hi"]}, "messages[0]", "must be an object"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "is missing"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "must be one of"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or an array"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "messages[0].content[0].type", "not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].image_url", "must be a data: URL"),
    ({**HELLO, "temperature": "hot"}, "temperature", "must be a number"),
    ({**HELLO, "temperature": 3}, "temperature", "between 0 and 2"),
    ({**HELLO, "max_tokens": 0}, "max_tokens", "at least 1"),
    ({**HELLO, "max_tokens": True}, "max_tokens", "must be an integer"),
    ({**HELLO, "stream": "yes"}, "stream", "true or false"),
    ({**HELLO, "stop": [1]}, "stop[0]", "must be a string"),
    ({**HELLO, "top_p": 1.5}, "top_p", "between 0 and 1"),
    ({**HELLO, "n": 2}, "n", "must be 1"),
    ({**HELLO, "tools": [{"type": "function"}]}, "tools[0].function", "is missing"),
    ({**HELLO, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", "true or false"),
])
def test_bad_fields_get_a_400_naming_the_field(server, body, param, says):
    status, _, answer = raw(server, post(CHAT, body))
    error = error_of(answer)
    assert status == 400 and error["param"] == param and says in error["message"]
    assert error["type"] == "invalid_request_error"


def test_ollama_errors_take_ollamas_shape(server):
    status, _, body = raw(server, post("/api/chat", {"model": MODEL, "messages": [{"role": "x"}]}))
    assert status == 400 and "messages[0].role" in json.loads(body)["error"]
    status, _, body = raw(server, post("/api/chat", {"model": MODEL, "messages": [
        {"role": "user", "content": "hi", "images": ["aGk="]}]}))
    assert status == 400 and "images" in json.loads(body)["error"]


def test_messages_that_cannot_fit_the_context_get_context_length_exceeded_with_the_numbers(serve_host):
    long = {"messages": [{"role": "user", "content": "word " * 1500}], "stream": True}
    with running(serve_host) as app:  # a body cap that lets it through
        status, _, body = raw(app, post(CHAT, long))
        error = error_of(body)
        assert status == 400 and error["code"] == "context_length_exceeded"
        assert "1024" in error["message"] and "needs" in error["message"]
        assert raw(app, post(CHAT, HELLO))[0] == 200  # and the server goes on


@pytest.mark.parametrize("model", ["/etc/passwd", "../../models/x.gguf", "x.gguf",
                                   "hf:org/repo/file.gguf", "C:\\models\\x.gguf"])
def test_a_model_named_as_a_path_or_hub_file_is_never_loaded(server, serve_host, model):
    status, _, body = raw(server, post(CHAT, {**HELLO, "model": model}))
    assert status == 404 and "never given as files" in error_of(body)["message"]
    assert serve_host.loaded.name == MODEL


def test_an_unknown_or_missing_model_is_a_404_that_names_localchat_pull(server):
    status, _, body = raw(server, post(CHAT, {**HELLO, "model": "no-such-model"}))
    assert status == 404 and "localchat pull" in error_of(body)["message"]
    status, _, body = raw(server, post("/api/chat", {**HELLO, "model": "qwen2.5-0.5b"}))
    assert status == 404 and json.loads(body)["error"] == (
        "model 'qwen2.5-0.5b' is not downloaded; run `localchat pull qwen2.5-0.5b`")


def test_unknown_routes_and_methods(server):
    assert raw(server, get("/v1/audio/speech"))[0] == 404  # no such route (embeddings now is one)
    status, headers, _ = raw(server, get(CHAT))
    assert status == 405 and headers["allow"] == "POST"
    assert raw(server, b"GARBAGE\r\n\r\n")[0] == 400


def test_bound_beyond_loopback_the_host_check_admits_addresses_and_with_a_key_any_name():
    from localchat.serve.http import Request
    from localchat.serve.safety import Gate

    def refused(gate: Gate, host: str) -> bool:
        return gate.refuse(Request("GET", "/v1/models", "HTTP/1.1", {
            "host": host, "authorization": "Bearer k"})) is not None

    open_gate, keyed = Gate("0.0.0.0", None, []), Gate("0.0.0.0", "k", [])
    assert not refused(open_gate, "192.168.1.20:8642") and refused(open_gate, "evil.example")
    assert not refused(keyed, "host.docker.internal:8642")
    assert refused(Gate("127.0.0.1", "k", []), "host.docker.internal:8642")
