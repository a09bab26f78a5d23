"""Reasoning with the real engine: the test model under Qwen3-style templates (reasoning_templates)."""

from __future__ import annotations

import pytest
from reasoning_templates import STRIPS_REASONING, SWITCH, THINKING

from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Done, Thinking, Token

pytestmark = pytest.mark.model


def engine_with(model_path, template: str) -> Engine:
    engine = Engine(model_path, EngineOptions(n_ctx=1024, gpu_layers=0, chat_template=template),
                    name="qwen3-style")
    engine.load()
    return engine


def events_of(handle) -> tuple[str, str, Done]:
    thinking, answer, done = [], [], None
    for event in handle:
        if isinstance(event, Thinking):
            thinking.append(event.text)
        elif isinstance(event, Token):
            answer.append(event.text)
        elif isinstance(event, Done):
            done = event
    return "".join(thinking), "".join(answer), done


@pytest.fixture(scope="module")
def switch_engine(test_model_path):
    engine = engine_with(test_model_path, SWITCH)
    yield engine
    engine.close()


def greedy(**overrides) -> Sampling:
    return Sampling(**{"temperature": 0.0, "repeat_penalty": 1.0, "max_tokens": 16, **overrides})


def test_reasoning_in_a_block_the_template_opens_streams_as_thinking(test_model_path):
    engine = engine_with(test_model_path, THINKING)
    try:
        thinking, answer, done = events_of(engine.submit([{"role": "user", "content": "Hi!"}], greedy()))
    finally:
        engine.close()

    assert thinking and answer == ""
    assert done.thinking == thinking and done.answer == ""
    assert done.reply.lstrip() == thinking  # the reply as generated: what history keeps
    t = done.timings
    assert t.thinking_n == t.predicted_n == 16
    assert t.ttft_ms > 0 and t.time_to_answer_ms == 0  # it never got to an answer


def test_thinking_switch_reaches_the_template(switch_engine):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    assert switch_engine.supports_thinking

    thinking, answer, off = events_of(switch_engine.submit(question, greedy(thinking="off")))
    assert thinking == "" and answer and off.thinking == "" and off.answer.strip() == answer
    assert off.timings.thinking_n == 0
    assert off.timings.time_to_answer_ms == off.timings.ttft_ms

    switch_engine.reset()
    thinking, answer, on = events_of(switch_engine.submit(question, greedy(thinking="on")))
    assert thinking and answer == "" and on.timings.thinking_n == on.timings.predicted_n

    switch_engine.reset()
    thinking, answer, auto = events_of(switch_engine.submit(question, greedy(thinking="auto")))
    assert thinking == "" and answer  # the template's default: no block


def test_a_model_without_a_switch_renders_the_same_prompt_whatever_the_setting(engine):
    question = [{"role": "user", "content": "Name a colour."}]
    assert not engine.supports_thinking

    _, auto_answer, _ = events_of(engine.submit(question, greedy()))
    engine.reset()
    thinking, on_answer, done = events_of(engine.submit(question, greedy(thinking="on")))

    assert thinking == "" and on_answer == auto_answer and done.timings.thinking_n == 0


def test_earlier_reasoning_leaves_the_context_and_only_what_follows_the_cut_is_prefilled(test_model_path):
    engine = engine_with(test_model_path, STRIPS_REASONING)
    try:
        history: list[dict[str, str]] = []
        turns = []
        for question in ("Hello, who are you?", "What is the capital of France?", "And of Italy?"):
            history.append({"role": "user", "content": question})
            _, _, done = events_of(engine.submit(history, greedy(max_tokens=12)))
            turns.append(done)
            history.append({"role": "assistant", "content": done.reply})
        cached = engine.cached_messages()

        # Oracle: the same conversation prefilled from scratch gives the same greedy reply.
        engine.reset()
        _, _, fresh = events_of(engine.submit(history[:-1], greedy(max_tokens=12)))
    finally:
        engine.close()

    last = turns[-1].timings
    assert last.prefix_fallback  # the template rendered the previous turn without its reasoning
    previous_reply, question, reply = cached[-3], cached[-2], cached[-1]
    assert "<think>" not in previous_reply.text  # it sits in context without its reasoning
    # Reused: every message before the previous reply, and the start of its header. The cut is
    # there, so prefilled: the previous answer, the new question and the next header.
    before = sum(len(m.tokens) for m in cached[:-3])
    assert before <= last.cache_n < before + len(previous_reply.tokens)
    generated = last.predicted_n - (1 if turns[-1].finish_reason == "length" else 0)
    prompt = before + len(previous_reply.tokens) + len(question.tokens) + len(reply.tokens) - generated
    assert last.cache_n + last.prompt_n == prompt
    assert fresh.reply == turns[-1].reply
