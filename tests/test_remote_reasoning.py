"""Reasoning from an OpenAI-compatible remote: ``reasoning_content`` deltas (llama.cpp server, vLLM,
DeepSeek) and inline ``<think>`` in ``content``, from a scripted server on loopback."""

from __future__ import annotations

import json

from fault_server import FaultServer, Stream, chunk, usage_chunk
from remote_fixtures import settings_for

from localchat.engine.options import Sampling
from localchat.events import Done, Thinking, Token
from localchat.remote.client import RemoteClient
from localchat.remote.context import trim_to_budget
from localchat.reply.reasoning import split_reply


def reasoning_chunk(text: str) -> str:
    return json.dumps({"object": "chat.completion.chunk", "model": "fault-model",
                       "choices": [{"index": 0, "delta": {"reasoning_content": text},
                                    "finish_reason": None}]})


def stream(*steps: str) -> Stream:
    return Stream([*steps, chunk(finish_reason="stop"), usage_chunk(9, 7), "[DONE]"])


def run(server: FaultServer) -> list:
    client = RemoteClient(settings_for(server.base_url))
    return list(client.stream([{"role": "user", "content": "2+2?"}], Sampling(max_tokens=64)))


def test_reasoning_content_streams_as_thinking_and_the_answer_as_tokens():
    script = stream(reasoning_chunk("Two plus"), reasoning_chunk(" two is four."),
                    chunk("\n\nIt is "), chunk("4."))
    with FaultServer([script]) as server:
        events = run(server)

    assert "".join(e.text for e in events if isinstance(e, Thinking)) == "Two plus two is four."
    assert "".join(e.text for e in events if isinstance(e, Token)) == "It is 4."
    done = events[-1]
    assert isinstance(done, Done) and done.thinking == "Two plus two is four."
    assert done.answer == "It is 4." and split_reply(done.reply) == ("Two plus two is four.", "It is 4.")
    t = done.timings
    assert t.thinking_n == 2 and t.predicted_n == 7  # reasoning chunks; the server's usage count
    assert 0 < t.ttft_ms <= t.time_to_answer_ms


def test_inline_think_tags_in_content_are_split_the_same_way():
    script = stream(chunk("<thi"), chunk("nk>\nTwo plus two"), chunk(" is four.</th"),
                    chunk("ink>\n\nIt is 4."))
    with FaultServer([script]) as server:
        events = run(server)

    assert "".join(e.text for e in events if isinstance(e, Thinking)) == "Two plus two is four."
    assert "".join(e.text for e in events if isinstance(e, Token)) == "It is 4."
    assert events[-1].thinking == "Two plus two is four." and events[-1].answer == "It is 4."


def test_a_reply_without_reasoning_has_no_thinking_and_answers_at_first_token():
    with FaultServer([stream(chunk("Just "), chunk("4."))]) as server:
        events = run(server)

    assert not any(isinstance(e, Thinking) for e in events)
    done = events[-1]
    assert done.reply == "Just 4." and done.thinking == ""
    assert done.timings.thinking_n == 0 and done.timings.time_to_answer_ms == done.timings.ttft_ms


def test_earlier_replies_reach_the_remote_without_their_reasoning():
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadding\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
    ]

    sent = trim_to_budget(messages, max_context_tokens=4096, reserve_tokens=256)

    assert sent[1] == {"role": "assistant", "content": "It is 4."}
    assert sent[0] == messages[0] and sent[2] == messages[2]
