"""Qwen3-style chat templates for the test model (SmolLM2 speaks the same ChatML).

Written after Qwen3's public template (tokenizer_config.json ``chat_template``), tools left out:
an assistant turn that holds ``</think>`` is split into reasoning and answer, and only turns after
the last user message keep their reasoning, so earlier turns' reasoning leaves the context. What
the generation prompt writes after ``<|im_start|>assistant\\n`` varies per template below.
"""

from __future__ import annotations

_HISTORY = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if message.role == 'user' and ns.last_query_index == messages|length - 1 %}"
    "{%- set ns.last_query_index = index %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and reasoning %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def qwen3_style(generation_prompt: str) -> str:
    """The template with ``generation_prompt`` (Jinja) after the assistant header."""
    return (_HISTORY + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
            + generation_prompt + "{%- endif %}")


# Qwen3-Thinking-2507: the template opens the block, the model writes reasoning then </think>.
THINKING = qwen3_style("{{- '<think>\\n' }}")

# A switch (Qwen3's enable_thinking); "on" opens the block here so that the test model, which
# never writes <think> by itself, reasons visibly.
SWITCH = qwen3_style(
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- elif enable_thinking is defined and enable_thinking %}{{- '<think>\\n' }}{%- endif %}")

# A stand-in for a model that reasoned and then answered: the template writes a fixed reasoning
# block and the model writes only the answer. (The 135M test model never writes </think> itself.)
# The KV cache then holds header, reasoning, answer; the next turn's history holds header, answer.
CANNED_REASONING = ("The user asked a question. I should answer briefly and politely, in one or "
                    "two sentences, without repeating the question.")
STRIPS_REASONING = qwen3_style("{{- '<think>\\n" + CANNED_REASONING + "\\n</think>\\n\\n' }}")
