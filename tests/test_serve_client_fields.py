"""What clients send ``localchat serve`` beyond the plain chat (issue 48, item 4, found by running
llama.cpp's server tests against it), through the ``openai`` SDK and the ``ollama`` library on
real sockets over the real test model: llama-server's shapes (``response_format`` json_object
with a schema, top-level ``grammar`` and ``json_schema``), a browser SDK's preflight, ``n``,
Ollama's digests and ``/api/ps``, and aliases for tools that hard-code a model's name."""

from __future__ import annotations

import hashlib
import json

import ollama
import pytest
import test_serve_tools
from oracle import NEAR_TIE
from serve_fixtures import MODEL, raw, running
from test_serve_safety import CHAT, HELLO, error_of, post

from localchat.errors import UserError
from localchat.serve.aliases import Aliases
from localchat.serve.model_host import ModelHost
from localchat.settings import Settings

pytestmark = pytest.mark.model

# The fixtures: one server for the module over the session's host, and the OpenAI SDK on it.
server, client = test_serve_tools.server, test_serve_tools.client

EXACT = {"temperature": 0, "max_tokens": 24, "extra_body": {"repeat_penalty": 1.0}}
COLOUR = [{"role": "user", "content": "Name a colour."}]
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
          "required": ["colour"]}


def ask(client, messages=COLOUR, **extra):
    body = {**EXACT, **extra, "extra_body": {**EXACT["extra_body"], **extra.get("extra_body", {})}}
    return client.chat.completions.create(model=MODEL, messages=messages, **body)


def test_json_object_with_a_schema_enforces_it_and_extra_keys_are_accepted(client):
    shaped = ask(client, response_format={"type": "json_object", "schema": SCHEMA})
    assert json.loads(shaped.choices[0].message.content)["colour"] in ("red", "green", "blue")
    named = ask(client, response_format={"type": "json_schema", "strict": True, "x-extra": 1,
                                         "json_schema": {"name": "c", "schema": SCHEMA}})
    assert set(json.loads(named.choices[0].message.content)) == {"colour"}
    anything = ask(client, response_format={"type": "json_object", "x-extra": {"a": 1}})
    assert anything.choices[0].message.content.startswith("{")
    plain = ask(client, response_format={"type": "text", "x-extra": 1})
    assert plain.choices[0].finish_reason in ("stop", "length")


def test_top_level_grammar_and_json_schema_shape_the_reply(client):
    answers = {ask(client, extra_body={"grammar": 'root ::= "yes" | "no"'}).choices[0]
               .message.content for _ in range(2)}
    assert answers <= {"yes", "no"} and len(answers) == 1
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(
        client, stream=True, extra_body={"grammar": 'root ::= [0-9] [0-9] [0-9]'}) if c.choices)
    assert len(streamed) == 3 and streamed.isdigit()
    shaped = ask(client, extra_body={"json_schema": SCHEMA})
    assert json.loads(shaped.choices[0].message.content)["colour"] in ("red", "green", "blue")


@pytest.mark.parametrize("extra, param, says", [
    ({"grammar": "root ::= (("}, "grammar", "does not parse"),
    ({"grammar": 'start ::= "a"'}, "grammar", "root"),
    # A token the model lacks: refused once its vocabulary is at hand (the turn starts).
    ({"grammar": "root ::= <|nonexistent|>"}, "grammar", "invalid token"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar",
     "cannot be given with response_format"),
    ({"json_schema": SCHEMA, "response_format": {"type": "json_object"}}, "json_schema",
     "cannot be given with response_format"),
    ({"grammar": 'root ::= "a"', "json_schema": SCHEMA}, "json_schema",
     "cannot be given with grammar"),
    ({"json_schema": "x"}, "json_schema", "must be an object"),
    ({"response_format": {"type": "json_object", "schema": 3}}, "response_format.schema",
     "JSON Schema"),
    ({"n": 2}, "n", "must be 1"),
    ({"n": 1000}, "n", "must be 1"),
])
def test_a_shape_or_choice_count_that_cannot_be_honoured_is_a_400_naming_the_field(
        server, extra, param, says):
    status, _, answer = raw(server, post(CHAT, {**HELLO, **extra}))
    error = error_of(answer)
    assert status == 400 and error["param"] == param and says in error["message"], error


def test_a_preflight_allows_the_headers_an_allowed_origin_asks_for(serve_host):
    def preflight(app, origin: str) -> tuple[int, dict[str, str]]:
        request = (f"OPTIONS {CHAT} HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\n"
                   "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: "
                   "authorization, content-type, x-stainless-os, x-stainless-retry-count, "
                   "bad header\r\nConnection: close\r\n\r\n").encode()
        status, headers, _ = raw(app, request)
        return status, headers

    with running(serve_host, cors_origins=["http://localhost:3000"]) as app:
        status, headers = preflight(app, "http://localhost:3000")
        allowed = [h.strip().lower() for h in headers["access-control-allow-headers"].split(",")]
        assert status == 204 and headers["access-control-allow-origin"] == "http://localhost:3000"
        assert {"authorization", "content-type", "x-stainless-os",
                "x-stainless-retry-count"} <= set(allowed)
        assert "bad header" not in allowed and len(allowed) == len(set(allowed))
        status, headers = preflight(app, "http://other.example")
        assert status == 403 and "access-control-allow-headers" not in headers


def test_tags_and_ps_give_the_files_sha256_hashed_once(server, serve_host, monkeypatch):
    from localchat.serve import digests

    hashed = []
    real_hash = digests._hash
    monkeypatch.setattr(digests, "_known", {})
    monkeypatch.setattr(digests, "_hash", lambda path: hashed.append(path) or real_hash(path))
    client = ollama.Client(host=server.base_url)
    expected = hashlib.sha256(serve_host.loaded.path.read_bytes()).hexdigest()

    (listed,) = client.list().models
    running_models = client.ps().models
    client.list()
    assert listed.digest == expected and len(hashed) == 1  # once, however often asked
    (loaded,) = running_models
    assert loaded.model == f"{MODEL}:latest" and loaded.digest == expected
    assert loaded.size == listed.size > 0 and loaded.size_vram == 0  # on the CPU
    assert loaded.details.format == "gguf" and loaded.expires_at.year > 2100


def test_an_alias_answers_as_the_served_model(server, serve_host, monkeypatch, client):
    monkeypatch.setattr(serve_host, "aliases", Aliases(["gpt-3.5-turbo", "llama3"], MODEL, []))
    assert [m.id for m in client.models.list().data] == [MODEL, "gpt-3.5-turbo", "llama3"]
    reply = client.chat.completions.create(model="gpt-3.5-turbo", messages=COLOUR, max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")
    ollama_client = ollama.Client(host=server.base_url)
    assert [m.model for m in ollama_client.list().models] == [
        f"{MODEL}:latest", "gpt-3.5-turbo:latest", "llama3:latest"]
    answer = ollama_client.chat(model="llama3:latest", messages=COLOUR, options={"num_predict": 2})
    assert answer.done


@pytest.mark.parametrize("alias, says", [(MODEL, "the name of a model"),
                                         (f"{MODEL}:q4_1", "the name of a model"),
                                         ("two words", "without spaces")])
def test_an_alias_that_is_a_models_name_is_refused_at_start(serve_host, alias, says):
    with pytest.raises(UserError) as refused:
        ModelHost(Settings(), serve_host.pinned, aliases=(alias,))
    assert says in str(refused.value) and "\n" not in str(refused.value)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def written(text: str) -> dict:
    """A grammar that makes the model write ``text`` exactly (calls are still read from it)."""
    return {"grammar": "root ::= " + json.dumps(text)}


@pytest.mark.parametrize("reply", [
    # The model echoing the tools' description: its "parameters" are the schema, no arguments.
    '<tool_call>\n{"name": "get_weather", "parameters": ' + json.dumps(
        WEATHER["function"]["parameters"]) + "}\n</tool_call>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "send_mail", "arguments": {"city": "Paris"}}\n</tool_call>',
])
def test_a_call_whose_arguments_do_not_fit_the_tool_is_plain_text_without_markers(client, reply):
    whole = ask(client, tools=[WEATHER], max_tokens=120, extra_body=written(reply)).choices[0]
    streamed = list(ask(client, tools=[WEATHER], max_tokens=120, stream=True,
                        extra_body=written(reply)))

    assert whole.finish_reason == "stop" and not whole.message.tool_calls
    assert whole.message.content == reply.removeprefix("<tool_call>\n").removesuffix(
        "\n</tool_call>")
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == whole.message.content
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in streamed)


def test_a_call_that_fits_the_tools_schema_is_a_call(client):
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    choice = ask(client, tools=[WEATHER], max_tokens=120, extra_body=written(reply)).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_logprobs_come_with_each_token_whole_and_streamed_and_leave_the_reply_as_it_was(client):
    ask(client)  # the prompt cached: each request below evaluates only its last token
    whole = ask(client, logprobs=True, top_logprobs=3).choices[0]
    chunks = list(ask(client, logprobs=True, top_logprobs=3, stream=True))
    plain = ask(client).choices[0]

    entries = whole.logprobs.content
    assert_same_or_near_tie(whole.message.content, plain.message.content, entries)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == whole.message.content
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy: the token drawn is the likeliest one.
        assert entry.token == entry.top_logprobs[0].token
        assert entry.logprob == pytest.approx(tops[0])
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    same = common_tokens_or_near_tie(streamed, entries)
    # The same numbers, as far as another batch shape lets them be (logits ~0.1 apart seen).
    assert [e.logprob for e in streamed[:same]] == pytest.approx([e.logprob for e in entries[:same]],
                                                                 abs=NEAR_TIE)
    for entry in streamed:  # each streamed entry is as consistent as a whole reply's
        assert entry.token == entry.top_logprobs[0].token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
    bare = ask(client, logprobs=True).choices[0].logprobs.content
    assert bare and all(e.top_logprobs == [] for e in bare)


def assert_same_or_near_tie(text: str, plain: str, entries) -> None:
    """Greedy: asking for logprobs leaves the reply as it was. llama.cpp is not batch-invariant,
    and the shared engine's cache may lay the prompt down in other batches (a shuffled run: the
    tests before left other states), which can flip a near-tie; the one accepted difference. At
    the first token where the replies part, the two likeliest tokens must be within a near-tie
    of each other (logprobs differ as the logits do), never a clear preference."""
    if text == plain:
        return
    common = next(i for i, (a, b) in enumerate(zip(text + "\0", plain + "\0")) if a != b)
    seen = 0
    for entry in entries:
        seen += len(bytes(entry.bytes).decode(errors="replace"))
        if seen > common:
            break
    margin = entry.top_logprobs[0].logprob - entry.top_logprobs[1].logprob
    assert margin < NEAR_TIE, f"the replies part at {entry.token!r} by {margin:.3f}: {text!r} vs {plain!r}"


def common_tokens_or_near_tie(a, b) -> int:
    """How many tokens two greedy replies' logprob entries share; where they part (if they do),
    it must be at a near-tie of the first (see ``assert_same_or_near_tie``)."""
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x.token != y.token), min(len(a), len(b)))
    if same < min(len(a), len(b)):
        margin = a[same].top_logprobs[0].logprob - a[same].top_logprobs[1].logprob
        assert margin < NEAR_TIE, f"the replies part at {a[same].token!r} by {margin:.3f}"
    else:
        assert len(a) == len(b)
    return same


@pytest.mark.parametrize("extra, param, says", [
    ({"logprobs": 10000}, "logprobs", "from 0 to 20"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"logprobs": "yes"}, "logprobs", "from 0 to 20"),
    ({"top_logprobs": 5}, "top_logprobs", "logprobs"),
])
def test_logprobs_past_openais_limit_are_a_400_naming_the_field(server, extra, param, says):
    status, _, answer = raw(server, post(CHAT, {**HELLO, **extra}))
    error = error_of(answer)
    assert status == 400 and error["param"] == param and says in error["message"], error
