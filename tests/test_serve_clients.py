"""``localchat serve`` through the clients users run: the ``openai`` SDK and the ``ollama`` library,
on a real server on 127.0.0.1 over the real test model, streamed and not; and the exact cache
behind them (the greedy oracle through the API, with conversations interleaved)."""

from __future__ import annotations

from dataclasses import replace

import ollama
import openai
import pytest
from oracle import GREEDY, assert_text_matches_fresh
from serve_fixtures import MODEL, running

pytestmark = pytest.mark.model

# Greedy, no repeat penalty: what the oracle replays (llama-server's extension fields).
EXACT = {"temperature": 0, "max_tokens": GREEDY.max_tokens, "extra_body": {"repeat_penalty": 1.0}}


@pytest.fixture(scope="module")
def server(serve_host):
    with running(serve_host) as app:
        yield app


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="any", max_retries=0)


def ask(client, messages, **extra):
    return client.chat.completions.create(model=MODEL, messages=messages, **{**EXACT, **extra})


def test_openai_sdk_lists_the_model_and_answers_whole_and_streamed(client, fresh):
    assert [m.id for m in client.models.list().data] == [MODEL]
    messages = [{"role": "user", "content": "Name a colour."}]

    whole = ask(client, messages)
    chunks = list(ask(client, messages, stream=True, stream_options={"include_usage": True}))

    choice = whole.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    # Both are the greedy reply (the second evaluates only the last prompt token: another batch
    # shape, which may flip a near-tie, as the oracle allows).
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert_text_matches_fresh(choice.message.content, fresh, messages)
    assert_text_matches_fresh(streamed, fresh, messages)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage  # the include_usage chunk: no choices, the usage
    assert chunks[-1].choices == [] and usage.completion_tokens == len(chunks) - 3
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    # The same messages again: everything but the last prompt token came from the cache.
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
    timings = finals[0].model_extra["timings"]  # llama-server's object, on the last chunk
    assert timings["predicted_n"] == usage.completion_tokens and timings["cache_n"] > 0


def test_ollama_library_lists_shows_and_chats_whole_and_streamed(server, fresh):
    client = ollama.Client(host=server.base_url)
    assert [m.model for m in client.list().models] == [f"{MODEL}:latest"]
    shown = client.show(f"{MODEL}:latest")
    assert "completion" in shown.capabilities and shown.details.format == "gguf"
    options = {"temperature": 0, "num_predict": 12, "repeat_penalty": 1.0}
    messages = [{"role": "user", "content": "Name an animal."}]

    whole = client.chat(model=MODEL, messages=messages, options=options, stream=False)
    parts = list(client.chat(model=f"{MODEL}:latest", messages=messages, options=options, stream=True))

    assert whole.done and whole.message.role == "assistant" and whole.message.content
    oracle = replace(GREEDY, max_tokens=12)
    assert_text_matches_fresh(whole.message.content, fresh, messages, oracle)
    assert_text_matches_fresh("".join(p.message.content for p in parts), fresh, messages, oracle)
    last = parts[-1]
    assert last.done and last.done_reason in ("stop", "length") and not any(p.done for p in parts[:-1])
    assert last.eval_count == len(parts) - 1 and whole.eval_count <= 12
    # Ollama counts what was evaluated: the same prompt again is one token from the cache.
    assert last.prompt_eval_count == 1 and last.eval_duration > 0


def test_greedy_replies_equal_a_fresh_prefill_with_conversations_interleaved(client, fresh):
    topics = ["the sea", "a mountain", "a city"]
    conversations = [[{"role": "system", "content": "Answer in one sentence."},
                      {"role": "user", "content": f"Tell me about {topic}."}] for topic in topics]
    follow_ups = ["Say more.", "Why?"]
    previous: dict[int, tuple[int, int]] = {}
    for turn in range(len(follow_ups) + 1):
        for c, messages in enumerate(conversations):  # each conversation takes the context in turn
            reply = ask(client, messages)
            text, usage = reply.choices[0].message.content, reply.usage
            assert_text_matches_fresh(text, fresh, messages)
            if c in previous:  # what its previous request left came back from the pool
                prompt, completion = previous[c]
                assert usage.prompt_tokens_details.cached_tokens >= prompt + completion - 1
            previous[c] = (usage.prompt_tokens, usage.completion_tokens)
            messages.append({"role": "assistant", "content": text})
            if turn < len(follow_ups):
                messages.append({"role": "user", "content": follow_ups[turn]})

    # An edit of the first conversation's last question: its earlier turns still come back.
    edited = conversations[0][:-2] + [{"role": "user", "content": "Tell me a joke instead."}]
    reply = ask(client, edited)
    assert_text_matches_fresh(reply.choices[0].message.content, fresh, edited)
    assert reply.usage.prompt_tokens_details.cached_tokens > 0


def test_without_room_for_saved_states_replies_stay_exact(client, fresh, serve_host):
    cap = serve_host.pool.cap_bytes
    serve_host.pool.cap_bytes = 0
    try:
        for topic in ("rivers", "stars"):
            messages = [{"role": "user", "content": f"One fact about {topic}."}]
            first = ask(client, messages).choices[0].message.content
            messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "More."}]
            assert_text_matches_fresh(ask(client, messages).choices[0].message.content, fresh, messages)
    finally:
        serve_host.pool.cap_bytes = cap


def test_a_stop_string_ends_the_answer_before_it(client):
    messages = [{"role": "user", "content": "Count from one to ten in words."}]
    full = ask(client, messages, max_tokens=24).choices[0].message.content
    words = full.split()
    assert len(words) > 3, full
    stop = words[2]

    reply = ask(client, messages, max_tokens=24, stop=[stop, "never appears"])

    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == full[:full.index(stop)]


def test_a_thinking_models_reasoning_streams_apart_from_the_answer(test_model_path):
    from reasoning_templates import THINKING
    from serve_fixtures import loaded_host

    from localchat.engine.engine import Engine
    from localchat.engine.options import EngineOptions

    def thinking_engine(model):
        engine = Engine(model.path, EngineOptions(n_ctx=512, gpu_layers=0, chat_template=THINKING),
                        name=model.name)
        engine.load()
        return engine

    host = loaded_host(test_model_path)
    host.unload()
    host._factory = thinking_engine
    try:
        with running(host) as app:
            client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=0)
            messages = [{"role": "user", "content": "Hi!"}]
            chunks = list(ask(client, messages, max_tokens=8, stream=True))
            whole = ask(client, messages, max_tokens=8)
            ollama_reply = ollama.Client(host=app.base_url).chat(
                model=MODEL, messages=messages, stream=False,
                options={"temperature": 0, "num_predict": 8, "repeat_penalty": 1.0})
    finally:
        host.unload()

    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    assert reasoning and not "".join(d.content or "" for d in deltas)  # all of it was reasoning
    assert whole.choices[0].message.model_extra["reasoning_content"] == reasoning
    assert whole.choices[0].message.content == ""
    assert ollama_reply.message.thinking == reasoning and ollama_reply.message.content == ""
