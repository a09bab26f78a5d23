"""The engine's side of tools: a turn whose Sampling offers tools renders them with the model's
template, constrains a call to the tool's schema (from the first token for "required" or a
name, from the family's marker for "auto"), streams the answer without markers or call JSON,
ends with Done.tool_calls, and after a tool round reuses the cache exactly (the greedy oracle;
only the result and the next header prefilled). With the real test model (the generic family),
scripted templates of the hermes, Llama 3.1 and Mistral families, and a random-weight model
with a 262,144-token vocabulary."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from oracle import assert_matches_fresh, loaded_engine, reply_tokens
from tool_templates import LLAMA31, MISTRAL_NEMO, QWEN25

from localchat.engine.options import Sampling
from localchat.events import Done, Failed, Token
from localchat.formats.tool_grammar import call_constraint
from localchat.reply.calls import ToolResult, assistant_message
from localchat.reply.families import FORMATS

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "local_time", "description": "The time of day.",
    "parameters": {"type": "object", "properties": {}}}}
TOOLS = (WEATHER, CLOCK)
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def tool_sampling(choice: str = "required", max_tokens: int = 48, **kw) -> Sampling:
    return Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=max_tokens, tools=TOOLS,
                    tool_choice=choice, **kw)


def run(engine, messages, sampling) -> tuple[str, Done]:
    texts, final = [], None
    for event in engine.submit(messages, sampling):
        if isinstance(event, Token):
            texts.append(event.text)
        final = event
    assert isinstance(final, Done), final
    return "".join(texts), final


def after_round(messages: list[dict], done: Done, result: str) -> list[dict]:
    call = done.tool_calls[0]
    return [*messages, assistant_message(done.reply, list(done.tool_calls)),
            ToolResult(call.id, call.name, result).to_message()]


def test_required_forces_a_call_that_streams_no_markers(engine):
    shown, done = run(engine, QUESTION, tool_sampling("required"))
    assert done.finish_reason == "stop"
    assert [c.name for c in done.tool_calls] == ["get_weather"] and done.tool_calls[0].runnable
    assert isinstance(done.tool_calls[0].arguments["city"], str)
    assert "<tool_call>" in done.reply and done.tool_calls[0].raw in done.reply
    assert "<tool_call" not in shown and "get_weather" not in shown and "{" not in shown
    assert done.answer == shown.strip()


def test_a_named_tool_is_the_one_called_and_an_unknown_name_fails_in_one_line(engine):
    _, done = run(engine, QUESTION, tool_sampling("local_time"))
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("local_time", {})]
    final = list(engine.submit(QUESTION, tool_sampling("send_mail")))[-1]
    assert isinstance(final, Failed) and "send_mail" in final.message and "\n" not in final.message


def test_none_shows_no_tools_and_reads_no_calls(engine):
    plain = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=8)
    assert engine.fresh_prompt(QUESTION, tool_sampling("none")) == engine.fresh_prompt(QUESTION, plain)
    assert len(engine.fresh_prompt(QUESTION, tool_sampling("auto"))) > len(engine.fresh_prompt(QUESTION))
    _, done = run(engine, QUESTION, tool_sampling("none", max_tokens=8))
    assert done.tool_calls == ()


def test_after_a_tool_round_only_the_result_is_prefilled_and_the_reply_is_exact(engine, fresh):
    _, first = run(engine, QUESTION, tool_sampling("required"))
    before = first.timings.cache_n + first.timings.prompt_n + first.timings.predicted_n
    history = after_round(QUESTION, first, "Sunny, 21 degrees.")
    sampling = tool_sampling("auto", max_tokens=24)
    shown, second = run(engine, history, sampling)
    prompt = engine.fresh_prompt(history, sampling)
    assert not second.timings.prefix_fallback
    # Everything before the result was reused: the prompt and every token of the call (the
    # end of generation that closed it was never evaluated; its end marker is prefilled).
    assert second.timings.cache_n == before
    assert second.timings.cache_n + second.timings.prompt_n == len(prompt)
    result_tokens = len(engine.tokenize("<tool_response>\nSunny, 21 degrees.\n</tool_response>"))
    assert second.timings.prompt_n <= result_tokens + 12
    tokens = [event.token_id for event in engine.submit(history, sampling)
              if isinstance(event, Token)]  # the same turn again, on the cache
    assert_matches_fresh(tokens[:16], fresh, history, replace(sampling, max_tokens=16))


def test_auto_is_free_until_the_marker_and_constrained_from_there(engine):
    """The test model writes <tool_call> when asked to repeat it: from there the grammar holds
    the call to an offered tool, and none of it streams."""
    echo = [{"role": "user", "content": "Repeat this text exactly: <tool_call>"}]
    shown, done = run(engine, echo, tool_sampling("auto"))
    assert [c.name for c in done.tool_calls] == ["get_weather"] and done.tool_calls[0].runnable
    assert done.timings.constrained_n > 0 and done.reply.startswith("<tool_call>")
    assert shown == "" and done.finish_reason == "stop"
    _, free = run(engine, QUESTION, tool_sampling("auto", max_tokens=8))
    assert free.timings.constrained_n == 0 and free.tool_calls == ()


def test_a_grammar_refusing_the_trigger_text_leaves_the_reply_free(engine):
    """A lazy grammar whose trigger matched text it cannot take (a call to a tool not
    offered) does not end the turn: the rest of the reply is free."""
    constraint = call_constraint(FORMATS["generic"], (WEATHER,), "auto")
    assert constraint is not None
    refusing = replace(constraint, trigger_patterns=(r"\w",))
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=8, constraint=refusing)
    _, done = run(engine, QUESTION, sampling)
    assert done.finish_reason == "length" and done.reply


@pytest.mark.parametrize("name, template", [("qwen25", QWEN25), ("llama31", LLAMA31),
                                            ("mistral", MISTRAL_NEMO)])
def test_each_family_renders_its_tools_and_reads_its_call(test_model_path, name, template):
    """The test model under another family's template: tools in that template's words, the call
    written in the family's form (the grammar's), read back, and the next turn reuses the cache
    up to the result."""
    with loaded_engine(test_model_path, 1024, name, chat_template=template,
                       speculative="off") as model:
        prompt = model.detokenize(model.fresh_prompt(QUESTION, tool_sampling("auto")))
        assert "get_weather" in prompt and "The weather in a city now." in prompt
        if name != "mistral":  # Mistral shows tools before the last user message only
            assert "You are provided" not in prompt or name == "qwen25"
        shown, done = run(model, QUESTION, tool_sampling("get_weather", max_tokens=96))
        assert done.finish_reason == "stop", done.reply
        assert [c.name for c in done.tool_calls] == ["get_weather"], done.reply
        assert done.tool_calls[0].runnable
        marker = {"qwen25": "<tool_call>", "llama31": "\"name\"", "mistral": "[TOOL_CALLS]"}[name]
        assert marker in done.reply and marker not in shown and "get_weather" not in shown
        history = after_round(QUESTION, done, "Sunny.")
        _, second = run(model, history, tool_sampling("auto", max_tokens=4))
        # The call's tokens as sampled (a fresh prompt may tokenize its text otherwise) stay.
        first = done.timings
        assert not second.timings.prefix_fallback
        assert second.timings.cache_n == first.cache_n + first.prompt_n + first.predicted_n
        assert second.timings.prompt_n < 80  # the result and the headers around it


def test_a_262k_vocabulary_model_writes_a_call_in_the_tools_schema(synthetic_model):
    """Random weights: the grammar alone makes the call, over 262,144 tokens."""
    city = {"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1,
                                                        "maximum": 7}},
            "required": ["city", "days"]}}}
    with loaded_engine(synthetic_model("vocab262k"), 512, "vocab262k", speculative="off") as big:
        sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=120, tools=(city,),
                            tool_choice="required")
        shown, done = run(big, QUESTION, sampling)
        assert done.finish_reason == "stop", done.reply
        (call,) = done.tool_calls
        assert call.name == "get_weather" and call.arguments["city"] in ("Paris", "Rome")
        assert 1 <= call.arguments["days"] <= 7
        assert json.dumps(call.arguments) not in shown and "<tool_call>" not in shown


def test_a_familys_marker_token_is_shown_as_text(test_model_path):
    """``<|python_tag|>`` and ``[TOOL_CALLS]`` are special tokens llama.cpp renders as nothing;
    the call parser must see them, and the history must render them back to the same token.
    The test model has neither, so one of its own special tokens stands in."""
    from localchat.engine.sampling.lead_bytes import lead_bytes

    with loaded_engine(test_model_path, 256, "marker", speculative="off") as model:
        runtime = model._require_runtime()
        (token,) = runtime.tokenize("<|im_start|>", False)
        assert runtime.piece(token) == b""
        runtime.show_as_text(["<|im_start|>", "two words"])  # not one token: left alone
        assert runtime.piece(token) == b"<|im_start|>" and runtime.text_tokens == [token]
        assert token in lead_bytes(runtime).end_tokens  # a redraw's candidate whatever its bytes


def test_a_tool_round_on_a_sliding_window_model_stays_exact(synthetic_model):
    """A memory that cannot drop cells (windowed layers, rolled back through checkpoints): the
    round still reuses everything before the result, and the reply is a fresh prefill's."""
    city = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"]}}}
    path = synthetic_model("gemma3-tiny")
    with loaded_engine(path, 1024, "swa", speculative="off") as model, \
            loaded_engine(path, 1024, "swa-oracle", speculative="off") as oracle:
        assert model.memory_kind == "swa"
        sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=80, tools=(city,),
                            tool_choice="required")
        _, first = run(model, QUESTION, sampling)
        assert first.finish_reason == "stop"
        assert first.tool_calls[0].arguments["city"] in ("Paris", "Rome")
        history = after_round(QUESTION, first, "Sunny.")
        again = replace(sampling, tool_choice="auto", max_tokens=12)
        tokens, second = reply_tokens(model.submit(history, again))
        t = first.timings
        assert second.timings.cache_n == t.cache_n + t.prompt_n + t.predicted_n
        assert not second.timings.prefix_fallback
        assert_matches_fresh(tokens, oracle, history, again)
