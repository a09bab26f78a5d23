"""Chat templates: which one a model uses, and rendering a conversation to prompt text.

The template comes from, in order: an explicit Jinja override (registry/config ``chat_template``),
the GGUF's ``tokenizer.chat_template`` metadata, or a named ``chat_format`` from the table below.
Rendering uses llama-cpp-python's sandboxed Jinja formatter so templates behave as they do there.

Templates of models with a thinking switch (Qwen3 style) read an ``enable_thinking`` variable:
true or unset lets the model reason first, false makes the template write an empty reasoning block
so that it answers at once. ``render`` passes it only when asked to, so "auto" is the template's
own default.

``render`` also takes the tools the model may call (the template's own ``tools`` variable) and any
other template variables; ``engine.tool_templates`` decides what to pass for a template that
knows tools and what to write instead for one that does not.

A render has a time limit (``RENDER_LIMIT_S``): a template that loops for ever (it is data from a
downloaded file) fails with a one-line EngineError instead of hanging the turn or the app's
model load; ``check_renders`` proves a template finishes on a small conversation at load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from localchat.engine.deadline import DeadlineExceeded, within
from localchat.errors import ConversationRejected, EngineError

# Rendering even a long conversation takes milliseconds; seconds mean the template loops.
RENDER_LIMIT_S = 5.0

# Named formats for GGUFs that carry no template. Written as Jinja so every format goes through
# one renderer and the same prefix-stability handling.
NAMED_FORMATS: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama-3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' "
        "else 'user' %}<start_of_turn>{{ role }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "phi-3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "mistral-instruct": (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}"
        "{{ m['content'] }}{{ eos_token }}{% else %}[INST] {{ m['content'] }} [/INST]{% endif %}"
        "{% endfor %}"
    ),
}

# (messages, add_generation_prompt, enable_thinking=None, tools=None, variables=None) -> prompt
Render = Callable[..., str]


def choose_template(
    model_name: str, gguf_template: str | None, override: str | None, chat_format: str | None
) -> str:
    """The Jinja template to use for this model, or a one-line EngineError saying what to set."""
    if override:
        return override
    if gguf_template:
        return gguf_template
    if chat_format:
        try:
            return NAMED_FORMATS[chat_format]
        except KeyError:
            known = ", ".join(sorted(NAMED_FORMATS))
            raise EngineError(
                f"unknown chat_format {chat_format!r} for {model_name}; known formats: {known}"
            ) from None
    raise EngineError(
        f"{model_name} has no chat template in its GGUF; add chat_format = \"chatml\" (or another "
        f"of {', '.join(sorted(NAMED_FORMATS))}) or a chat_template to its models.toml entry"
    )


def has_thinking_switch(template: str) -> bool:
    """Whether the template reads ``enable_thinking`` (the Qwen3-style switch)."""
    return "enable_thinking" in template


def make_renderer(template: str, bos_token: str, eos_token: str) -> Render:
    """``render(messages, add_generation_prompt, enable_thinking=None, tools=None,
    variables=None) -> str`` for one template; ``enable_thinking`` None leaves the variable unset
    (the template's default), ``tools`` are OpenAI function specs, ``variables`` any others."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        with_prompt = Jinja2ChatFormatter(template, eos_token, bos_token, add_generation_prompt=True)
        without_prompt = Jinja2ChatFormatter(template, eos_token, bos_token, add_generation_prompt=False)
    except Exception as exc:  # jinja2.TemplateSyntaxError and friends
        raise EngineError(f"the chat template does not parse: {exc}") from None

    def render(messages: list[dict], add_generation_prompt: bool,
               enable_thinking: bool | None = None, tools: list[dict] | None = None,
               variables: Mapping[str, Any] | None = None) -> str:
        formatter = with_prompt if add_generation_prompt else without_prompt
        extra = dict(variables or {})
        if enable_thinking is not None:
            extra["enable_thinking"] = enable_thinking
        try:
            # llama-cpp-python passes extra keywords on to the template as variables.
            return within(RENDER_LIMIT_S, lambda: formatter(
                messages=messages, tools=tools, **extra).prompt)  # type: ignore[arg-type]
        except DeadlineExceeded:
            raise EngineError(f"the chat template did not finish rendering within {RENDER_LIMIT_S:g} s "
                              "(it loops); set a working chat_template or chat_format for this "
                              "model in models.toml") from None
        except Exception as exc:  # templates raise for role orders they do not support
            raise ConversationRejected(f"the chat template rejected the conversation: {exc}") from None

    return render


def check_renders(render: Render) -> None:
    """Raise EngineError unless ``render`` finishes a one-message conversation in time (it
    raises in the template's own words or says that it loops)."""
    render([{"role": "user", "content": "x"}], True)


def with_thinking(render: Render, thinking: str, supported: bool) -> Render:
    """``render`` with the thinking switch set for "on"/"off"; as it is for "auto" or a template
    without the switch."""
    flag = {"on": True, "off": False}.get(thinking)
    if flag is None or not supported:
        return render
    return lambda messages, add_generation_prompt: render(messages, add_generation_prompt,
                                                         enable_thinking=flag)
