"""Tools rendered with the model's own chat template (Qwen 2.5, Llama 3.1, Mistral Nemo), and the
generic system prompt for templates that know no tools (SmolLM2's, one without a system role)."""

from __future__ import annotations

import pytest

from localchat.engine.templates import make_renderer, with_thinking
from localchat.engine.tool_templates import (
    ToolSupport,
    probe_support,
    shape_for_template,
    tool_rendering,
    with_tools,
)
from localchat.reply.call_stream import ToolCallSplitter
from localchat.reply.calls import ToolCall, ToolResult, assistant_message
from tests.reasoning_templates import SWITCH
from tests.tool_templates import LLAMA31, MISTRAL_NEMO, QWEN25, SMOLLM2

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The time now.",
    "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

# A template like Gemma 2's: no system role at all.
NO_SYSTEM = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

CALL = ToolCall("abc123XYZ", "get_weather", {"city": "Paris"})
RESULT = ToolResult("abc123XYZ", "get_weather", "18 °C and sunny")
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    assistant_message("", [CALL]),
    RESULT.to_message(),
]


def _renderer(template):
    return make_renderer(template, "<s>", "</s>")


@pytest.mark.parametrize("template, family, support", [
    (QWEN25, "hermes", ToolSupport(tools=True, tool_calls=True, tool_responses=True,
                                   parallel_calls=True)),
    (LLAMA31, "llama3", ToolSupport(tools=True, tool_calls=True, tool_responses=True,
                                    parallel_calls=False)),
    (MISTRAL_NEMO, "mistral", ToolSupport(tools=True, tool_calls=True, tool_responses=True,
                                          parallel_calls=True)),
    (SMOLLM2, "generic", ToolSupport(tools=False, tool_calls=False, tool_responses=True)),
    (NO_SYSTEM, "generic", ToolSupport(tool_responses=True, system_role=False)),
])
def test_what_each_template_supports_is_found_by_probing(template, family, support):
    rendering = tool_rendering(template, _renderer(template))
    assert rendering.format.name == family
    assert rendering.support == support


def _render(template, messages, tools=TOOLS, add_generation_prompt=True):
    render = _renderer(template)
    rendering = tool_rendering(template, render)
    return with_tools(render, rendering, tools)(messages, add_generation_prompt)


def test_qwen_renders_tools_calls_and_results_itself():
    prompt = _render(QWEN25, CONVERSATION)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather", "description": "The weather now in a city."' in prompt
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in prompt
    assert "<|im_start|>user\n<tool_response>\n18 °C and sunny\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_llama_gets_its_tools_in_the_system_message_and_one_call_per_message():
    two_calls = [*CONVERSATION[:2],
                 assistant_message("", [CALL, ToolCall("def456UVW", "get_time", {})]),
                 ToolResult("def456UVW", "get_time", "12:00").to_message(),
                 RESULT.to_message()]
    prompt = _render(LLAMA31, two_calls)
    system, _, rest = prompt.partition("<|eot_id|>")
    assert "You have access to the following functions" in system and '"get_time"' in system
    assert rest.startswith("<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>")
    # The template takes one call per message: each call is followed by its own result.
    weather = rest.index('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    paris = rest.index('"18 °C and sunny"')
    time = rest.index('{"name": "get_time", "parameters": {}}')
    noon = rest.index('"12:00"')
    assert weather < paris < time < noon
    assert rest.count("<|start_header_id|>ipython<|end_header_id|>") == 2


def test_mistral_gets_nine_character_ids_even_for_a_remote_models_ids():
    remote = ToolCall("call_0123456789abcdef", "get_weather", {"city": "Paris"})
    prompt = _render(MISTRAL_NEMO, [
        {"role": "user", "content": "Weather in Paris?"}, assistant_message("", [remote]),
        ToolResult(remote.id, "get_weather", "18").to_message(),
        {"role": "assistant", "content": "It is 18."}, {"role": "user", "content": "Thanks"}])
    assert "[AVAILABLE_TOOLS][" in prompt
    start = prompt.index('"id": "') + len('"id": "')
    call_id = prompt[start:start + 9]
    assert call_id.isalnum() and prompt[start + 9] == '"'
    assert f'"call_id": "{call_id}"}}[/TOOL_RESULTS]' in prompt


def test_a_template_without_tools_gets_the_generic_prompt_calls_as_text_and_results_as_user():
    prompt = _render(SMOLLM2, CONVERSATION)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '{"name": "get_weather", "description": "The weather now in a city."' in prompt
    assert "<tool_call></tool_call> tags" in prompt
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in prompt
    assert "<|im_start|>user\n<tool_response>\n18 °C and sunny\n</tool_response><|im_end|>" in prompt
    assert "<|im_start|>tool" not in prompt


def test_a_template_without_a_system_role_gets_the_tools_before_the_first_message():
    prompt = _render(NO_SYSTEM, CONVERSATION[1:])
    assert prompt.startswith("<s><start_of_turn>user\n# Tools\n")
    assert "Weather in Paris?<end_of_turn>" in prompt


@pytest.mark.parametrize("template", [QWEN25, LLAMA31, MISTRAL_NEMO, SMOLLM2])
def test_the_parser_reads_back_the_calls_each_template_writes(template):
    """What the template writes for a call in the history is what the model was trained to
    write: the family's splitter must read it back as the same call."""
    render = _renderer(template)
    rendering = tool_rendering(template, render)
    question = [{"role": "user", "content": "Weather in Paris?"}]
    before = with_tools(render, rendering, TOOLS)(question, True)
    after = with_tools(render, rendering, TOOLS)([*question, assistant_message("", [CALL])], False)
    assert after.startswith(before)
    splitter = ToolCallSplitter(rendering.format, tool_names=("get_weather", "get_time"))
    pieces = splitter.feed(after[len(before):]) + splitter.flush()
    [call] = [p for p in pieces if isinstance(p, ToolCall)]
    assert (call.name, call.arguments, call.problem) == ("get_weather", {"city": "Paris"}, "")


@pytest.mark.parametrize("template", [QWEN25, LLAMA31, MISTRAL_NEMO, SMOLLM2])
def test_without_tools_or_calls_the_prompt_is_the_templates_own(template):
    render = _renderer(template)
    rendering = tool_rendering(template, render)
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Bye"}]
    assert with_tools(render, rendering, [])(plain, True) == render(plain, True)


def test_earlier_calls_render_when_no_tools_are_offered_now():
    shaped, tools, variables = shape_for_template(
        CONVERSATION, tool_rendering(SMOLLM2, _renderer(SMOLLM2)), [])
    assert tools is None and variables == {}
    assert shaped[2]["content"].startswith("<tool_call>") and shaped[3]["role"] == "user"


def test_the_thinking_switch_still_applies_over_tools():
    render = _renderer(SWITCH)
    rendering = tool_rendering(SWITCH, render)
    prompt = with_thinking(with_tools(render, rendering, TOOLS), "off", True)(
        [{"role": "user", "content": "Hi"}], True)
    assert "# Tools" in prompt and prompt.endswith("<think>\n\n</think>\n\n")


def test_a_template_that_raises_on_tools_is_probed_as_supporting_none():
    raising = ("{% if tools %}{{ raise_exception('no tools here') }}{% endif %}"
               "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert probe_support(_renderer(raising)).tools is False
