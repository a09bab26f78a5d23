"""Tools in the prompt: with the model's own chat template where it can, a generic prompt where not.

A model calls tools well when they are shown the way it was trained to see them, so the template
renders them itself (its ``tools`` variable, ``tool_calls`` on assistant messages, ``tool`` role
messages with their ids), as llama.cpp's server does. What a template can do is found by rendering
small probe conversations once per model (:func:`probe_support`, after minja's capability checks
in llama.cpp): whether the tools, the calls, the results, two calls in one message and a system
message show up in its output, and whether it wants a call's arguments as an object (the
Hugging Face convention) or as a JSON string.

The conversation keeps one shape whatever the template (OpenAI's): an assistant message may carry
``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments an
object or a JSON string) and results are ``{"role": "tool", "tool_call_id", "name", "content"}``
messages (``reply.calls.assistant_message`` and ``ToolResult.to_message`` build them).
:func:`with_tools` reshapes it for the template each render:

- a template of a known family that renders tools gets them natively (and Llama 3's
  ``tools_in_user_message`` false, as llama.cpp sets it, so the tools sit in the system message
  and the first user message renders the same with or without them);
- a template that cannot show the calls gets them as text in the hermes form; one that cannot
  take several calls per message gets one message per call, each followed by its result; one
  without a tool role gets the results as a user message of ``<tool_response>`` blocks;
- a template that knows nothing of tools (the ``generic`` family) gets a system prompt that lists
  them and asks for the hermes form, which ``reply.call_stream`` then reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from localchat.engine.templates import Render
from localchat.reply.calls import ToolCall, nine_character_id, render_call_text
from localchat.reply.families import ToolFormat, detect_format


@dataclass(frozen=True)
class ToolSupport:
    """What a chat template shows of tools (found by :func:`probe_support`)."""

    tools: bool = False  # the tool list
    tool_calls: bool = False  # assistant messages' calls
    tool_responses: bool = False  # tool role messages
    parallel_calls: bool = False  # several calls in one assistant message
    string_arguments: bool = False  # calls' arguments as a JSON string rather than an object
    system_role: bool = True


@dataclass(frozen=True)
class ToolRendering:
    """How one model's template takes tools: its family's call format and what it supports."""

    format: ToolFormat
    support: ToolSupport

    @property
    def native(self) -> bool:
        """Whether the template itself describes the tools to the model."""
        return self.format.template_shows_tools and self.support.tools


def tool_rendering(template: str, render: Render) -> ToolRendering:
    """The rendering for a model: its family from the template text, its support by probing."""
    return ToolRendering(detect_format(template), probe_support(render))


_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool_alpha", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}},
                   "required": ["probe_arg"]}}}
_USER = {"role": "user", "content": "probe question"}


def _probe_call(name: str, call_id: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _shows(render: Render, messages: list[dict], needles: Iterable[str],
           tools: list[dict] | None = None) -> bool:
    try:
        text = render(messages, False, tools=tools, variables={"tools_in_user_message": False})
    except Exception:  # a template refuses what it does not support in its own way
        return False
    return all(needle in text for needle in needles)


def probe_support(render: Render) -> ToolSupport:
    """What ``render``'s template shows of tools, from a few renders of probe conversations."""
    tools = [_PROBE_TOOL]
    supports_tools = _shows(render, [_USER], ["probe_tool_alpha"], tools)
    string_arguments = False
    tool_calls = False
    for arguments in ({"probe_arg": "probe-value"}, '{"probe_arg": "probe-value"}'):
        calls = [_probe_call("probe_call_one", "pr0be0ca1", arguments)]
        if _shows(render, [_USER, {"role": "assistant", "content": "", "tool_calls": calls}],
                  ["probe_call_one", "probe-value"], tools):
            tool_calls, string_arguments = True, isinstance(arguments, str)
            break
    arguments = '{"probe_arg": "probe-value"}' if string_arguments else {"probe_arg": "probe-value"}
    one = _probe_call("probe_call_one", "pr0be0ca1", arguments)
    two = _probe_call("probe_call_two", "pr0be0ca2", arguments)
    parallel = tool_calls and _shows(
        render, [_USER, {"role": "assistant", "content": "", "tool_calls": [one, two]}],
        ["probe_call_one", "probe_call_two"], tools)
    responses = _shows(render, [_USER, {"role": "assistant", "content": "", "tool_calls": [one]},
                                {"role": "tool", "tool_call_id": "pr0be0ca1",
                                 "name": "probe_call_one", "content": "probe-result"}],
                       ["probe-result"], tools)
    system = _shows(render, [{"role": "system", "content": "probe-system"}, _USER],
                    ["probe-system"])
    return ToolSupport(tools=supports_tools, tool_calls=tool_calls, tool_responses=responses,
                       parallel_calls=parallel, string_arguments=string_arguments,
                       system_role=system)


def with_tools(render: Render, rendering: ToolRendering, tools: list[dict]) -> Render:
    """``render`` for a conversation in which the model may call ``tools`` (OpenAI function
    specs; may be empty when only earlier calls need rendering): ``(messages,
    add_generation_prompt, enable_thinking=None) -> prompt``, so ``templates.with_thinking``
    can wrap it."""

    def render_with_tools(messages: list[dict], add_generation_prompt: bool,
                          enable_thinking: bool | None = None) -> str:
        shaped, native_tools, variables = shape_for_template(messages, rendering, tools)
        return render(shaped, add_generation_prompt, enable_thinking=enable_thinking,
                      tools=native_tools, variables=variables)

    return render_with_tools


def shape_for_template(messages: list[dict], rendering: ToolRendering, tools: list[dict]
                       ) -> tuple[list[dict], list[dict] | None, dict[str, Any]]:
    """(messages, tools to pass, template variables) for one render (see the module)."""
    support, native = rendering.support, rendering.native
    if rendering.format.nine_character_ids:  # its templates refuse ids of another length
        messages = [_with_nine_character_ids(m) for m in messages]
    shaped: list[dict] = []
    pending_results: list[dict] = []
    for message in _one_call_per_message(messages, native and support.tool_calls
                                         and not support.parallel_calls):
        if message.get("role") == "tool":
            if native and support.tool_responses:
                shaped.append(_tool_message(message))
            else:
                pending_results.append(message)
            continue
        if pending_results:
            shaped.append(_results_as_user(pending_results))
            pending_results = []
        if message.get("role") == "assistant" and message.get("tool_calls"):
            shaped.append(_assistant(message, native and support.tool_calls,
                                     support.string_arguments))
        else:
            shaped.append(message)
    if pending_results:
        shaped.append(_results_as_user(pending_results))
    if not tools:
        return shaped, None, {}
    if native:
        return shaped, tools, {"tools_in_user_message": False}
    return _with_system_text(shaped, generic_tools_prompt(tools), support.system_role), None, {}


def _with_nine_character_ids(message: dict) -> dict:
    if message.get("role") == "tool":
        return {**message, "tool_call_id": nine_character_id(str(message.get("tool_call_id", "")))}
    if message.get("tool_calls"):
        return {**message, "tool_calls": [{**entry, "id": nine_character_id(str(entry.get("id", "")))}
                                          for entry in message["tool_calls"]]}
    return message


def _calls_of(message: dict) -> list[ToolCall]:
    return [ToolCall.from_openai(entry) for entry in message.get("tool_calls") or []]


def _assistant(message: dict, native: bool, string_arguments: bool) -> dict:
    calls = _calls_of(message)
    content = message.get("content") or ""
    if not native:
        text = "\n".join([content, *(render_call_text(call) for call in calls)] if content
                         else [render_call_text(call) for call in calls])
        return {"role": "assistant", "content": text}
    entries = [{"id": call.id, "type": "function", "function": {
        "name": call.name,
        "arguments": call.arguments_json() if string_arguments else call.arguments}}
        for call in calls]
    return {**message, "content": content, "tool_calls": entries}


def _tool_message(message: dict) -> dict:
    return {"role": "tool", "tool_call_id": message.get("tool_call_id", ""),
            "name": message.get("name", ""), "content": message.get("content") or ""}


def _results_as_user(results: list[dict]) -> dict:
    blocks = [f"<tool_response>\n{r.get('content') or ''}\n</tool_response>" for r in results]
    return {"role": "user", "content": "\n".join(blocks)}


def _one_call_per_message(messages: list[dict], split: bool) -> list[dict]:
    """For templates that take one call per assistant message (Llama 3.1): a message with
    several calls becomes one per call, each followed by its own result."""
    if not split:
        return messages
    out: list[dict] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        calls = message.get("tool_calls") or []
        if message.get("role") != "assistant" or len(calls) < 2:
            out.append(message)
            i += 1
            continue
        j = i + 1
        results: dict[str, dict] = {}
        while j < len(messages) and messages[j].get("role") == "tool":
            results[str(messages[j].get("tool_call_id", ""))] = messages[j]
            j += 1
        for k, entry in enumerate(calls):
            out.append({**message, "content": message.get("content") if k == 0 else "",
                        "tool_calls": [entry]})
            if str(entry.get("id", "")) in results:
                out.append(results.pop(str(entry.get("id", ""))))
        out.extend(results.values())  # results whose call id matched none: keep them, in order
        i = j
    return out


def _with_system_text(messages: list[dict], text: str, system_role: bool) -> list[dict]:
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        content = first.get("content") or ""
        return [{**first, "content": f"{content}\n\n{text}" if content else text}, *messages[1:]]
    if system_role or not messages:
        return [{"role": "system", "content": text}, *messages]
    first = messages[0]  # no system role: the tools go before the first message's text
    return [{**first, "content": f"{text}\n\n{first.get('content') or ''}"}, *messages[1:]]


def generic_tools_prompt(tools: list[dict]) -> str:
    """The system prompt that shows ``tools`` to a model whose template knows none, asking for
    the hermes form (what llama.cpp and most fine-tunes use)."""
    signatures = "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False)
                           for tool in tools)
    return ("# Tools\n\nYou may call one or more tools to help with the user's request. Their "
            "signatures, as JSON, are within <tools></tools> tags:\n<tools>\n"
            f"{signatures}\n</tools>\n\n"
            "To call a tool, write a JSON object with its name and arguments within "
            "<tool_call></tool_call> tags, one block per call:\n"
            '<tool_call>\n{"name": <tool-name>, "arguments": <arguments-as-a-JSON-object>}\n'
            "</tool_call>\n\n"
            "Each result comes back within <tool_response></tool_response> tags. When no tool "
            "is needed, answer directly.")
