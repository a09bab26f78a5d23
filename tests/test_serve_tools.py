"""Tools and answer shapes through ``localchat serve``, with the clients users run: the model's
calls come back as OpenAI ``tool_calls`` (whole, and streamed as deltas with one id and name per
call) and Ollama ``message.tool_calls``; a client's history with calls and results is answered,
the call rendered as the model wrote it so the cache serves everything before the result and
the reply equals a fresh prefill's; ``response_format`` and Ollama's ``format`` shape the reply.
The server never runs a tool."""

from __future__ import annotations

import json
from dataclasses import replace

import ollama
import openai
import pytest
from oracle import GREEDY, assert_text_matches_fresh
from serve_fixtures import MODEL, raw, running
from test_serve_safety import CHAT, HELLO, error_of, post

from localchat.events import Done
from localchat.reply.calls import ToolResult, assistant_message

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# A prompt after which the test model writes <tool_call> of its own accord (tool_choice auto).
ECHO = [{"role": "user", "content": "Repeat this text exactly: <tool_call>"}]
EXACT = {"temperature": 0, "max_tokens": 48, "extra_body": {"repeat_penalty": 1.0}}


@pytest.fixture(scope="module")
def server(serve_host):
    with running(serve_host) as app:
        yield app


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="any", max_retries=0)


def ask(client, messages, **extra):
    return client.chat.completions.create(model=MODEL, messages=messages, **{**EXACT, **extra})


def test_openai_tool_calls_whole_and_streamed(client):
    whole = ask(client, QUESTION, tools=[WEATHER], tool_choice="required")
    chunks = list(ask(client, QUESTION, tools=[WEATHER], stream=True,
                      tool_choice={"type": "function", "function": {"name": "get_weather"}}))

    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].index == 0 and deltas[0].id
    assert deltas[0].function.name == "get_weather"
    assert json.loads(deltas[0].function.arguments) == json.loads(call.function.arguments)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text and "get_weather" not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] \
        == ["tool_calls"]


def test_a_question_asked_with_tools_and_without_finds_each_ones_cells(client):
    # Offered tools, the template writes them ahead of the question: the same message is other
    # tokens. Weighed by role and content, that state looked like this conversation and was
    # restored over it (cached_tokens 3 of 34 in a CI run).
    question = [{"role": "user", "content": "Name a fruit."}]
    ask(client, question, tools=[WEATHER], max_tokens=4)
    for _ in range(2):
        plain = ask(client, question, max_tokens=4)
    assert plain.usage.prompt_tokens_details.cached_tokens == plain.usage.prompt_tokens - 1
    offered = ask(client, question, tools=[WEATHER], max_tokens=4)
    assert offered.usage.prompt_tokens_details.cached_tokens == offered.usage.prompt_tokens - 1


def test_a_tool_round_through_the_api_reuses_the_cache_and_equals_a_fresh_prefill(client, fresh):
    first = ask(client, QUESTION, tools=[WEATHER], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    history = [*QUESTION, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."}]
    second = ask(client, history, tools=[WEATHER], max_tokens=16)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The call came back as the model wrote it: everything before the result was cached.
    before = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= before
    assert second.usage.prompt_tokens - second.usage.prompt_tokens_details.cached_tokens < 40
    # The fresh engine's own round (greedy: the same call) and its next reply.
    sampling = replace(GREEDY, tools=(WEATHER,), tool_choice="required", max_tokens=48)
    done = list(fresh.submit(QUESTION, sampling))[-1]
    assert isinstance(done, Done) and done.tool_calls
    engine_history = [*QUESTION, assistant_message(done.reply, list(done.tool_calls)),
                      ToolResult(done.tool_calls[0].id, "get_weather",
                                 "Sunny, 21 degrees.").to_message()]
    assert_text_matches_fresh(second.choices[0].message.content or "", fresh, engine_history,
                              replace(GREEDY, tools=(WEATHER,), max_tokens=16))


def test_ollama_tool_calls_and_a_history_with_results(server):
    client = ollama.Client(host=server.base_url)
    options = {"temperature": 0, "num_predict": 48, "repeat_penalty": 1.0}
    whole = client.chat(model=MODEL, messages=ECHO, tools=[WEATHER], options=options,
                        stream=False)
    parts = list(client.chat(model=MODEL, messages=ECHO, tools=[WEATHER], options=options,
                             stream=True))

    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    assert "<tool_call>" not in whole.message.content and whole.done_reason == "stop"
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.name for c in streamed] == ["get_weather"] and parts[-1].done
    assert "<tool_call>" not in "".join(p.message.content for p in parts)

    history = [*ECHO, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny."}]
    after = client.chat(model=MODEL, messages=history, tools=[WEATHER],
                        options={**options, "num_predict": 8}, stream=False)
    assert after.done and after.prompt_eval_count < 40  # the call came from the cache


def test_openai_response_format_shapes_the_reply(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"]}
    shaped = ask(client, [{"role": "user", "content": "Name a colour."}], response_format={
        "type": "json_schema", "json_schema": {"name": "colour", "schema": schema}})
    assert set(json.loads(shaped.choices[0].message.content)) == {"colour"}
    anything = ask(client, [{"role": "user", "content": "Name a colour."}],
                   response_format={"type": "json_object"}).choices[0]
    # Any object: the test model nests them until the token limit, never leaving JSON.
    assert anything.message.content.startswith("{")
    if anything.finish_reason == "stop":
        assert isinstance(json.loads(anything.message.content), dict)


def test_ollama_format_shapes_the_reply(server):
    client = ollama.Client(host=server.base_url)
    options = {"temperature": 0, "num_predict": 48, "repeat_penalty": 1.0}
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}}, "required": ["n"]}
    shaped = client.chat(model=MODEL, messages=[{"role": "user", "content": "A digit."}],
                         format=schema, options=options)
    assert 0 <= json.loads(shaped.message.content)["n"] <= 9
    plain = client.chat(model=MODEL, messages=[{"role": "user", "content": "A digit."}],
                        format="json", options=options)
    assert plain.message.content.startswith("{")
    if plain.done_reason == "stop":
        assert isinstance(json.loads(plain.message.content), dict)


@pytest.mark.parametrize("body, param, says", [
    ({**HELLO, "tools": "x"}, "tools", "must be an array"),
    ({**HELLO, "tools": [{"type": "function"}]}, "tools[0].function", "is missing"),
    ({**HELLO, "tools": [{"type": "function", "function": {"name": ""}}]},
     "tools[0].function.name", "1 to 128"),
    ({**HELLO, "tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "must be auto"),
    ({**HELLO, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {
        "name": "send_mail"}}}, "tool_choice", "not among the tools"),
    ({**HELLO, "tool_choice": "required"}, "tool_choice", "offers no tools"),
    ({"messages": [*HELLO["messages"], {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls", "assistant"),
    ({**HELLO, "response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({**HELLO, "response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "patternProperties": {}}}}}, "response_format", "cannot be enforced"),
])
def test_bad_tool_and_format_fields_get_a_400_naming_the_field(server, body, param, says):
    status, _, answer = raw(server, post(CHAT, body))
    error = error_of(answer)
    assert status == 400 and error["param"] == param and says in error["message"], error


def test_a_tool_result_without_a_call_is_answered(server):
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "tool", "content": "42"}], "max_tokens": 2}
    status, _, answer = raw(server, post(CHAT, body))
    assert status == 200, answer
    status, _, answer = raw(server, post("/api/chat", {
        "model": MODEL, "stream": False, "format": 5, "messages": HELLO["messages"]}))
    assert status == 400 and "format" in json.loads(answer)["error"]
