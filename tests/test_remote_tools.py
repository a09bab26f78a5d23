"""Tools through the remote model: sent as OpenAI ``tools``/``tool_choice``, streamed
``tool_calls`` deltas assembled into calls, the same approval step and tool loop, arguments checked
before anything runs; against a real llama_cpp.server (a forced call) and a scripted server
(what a real one will not send on demand: pieces, wrong arguments)."""

from __future__ import annotations

import json
from pathlib import Path

from fault_server import FaultServer, Stream, reply
from remote_fixtures import llama_server, settings_for  # noqa: F401 - a fixture

from localchat.chat.escalation import Escalation
from localchat.chat.tool_rounds import start
from localchat.chat.tools import ChatTools
from localchat.context.chat_context import ChatContext
from localchat.engine.options import Sampling
from localchat.events import Done, ToolCalled, ToolReturned
from localchat.remote.client import RemoteClient
from localchat.remote.escalate import Escalator
from localchat.remote.tool_wire import CallAssembler, tool_fields, wire_messages
from localchat.reply.calls import ToolCall
from localchat.settings import Settings
from localchat.settings.tools import ToolsSettings
from tests.calling_engine import call_text
from tests.fake_engine import FakeEngine

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                     "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def tool_chunk(*deltas: dict, finish_reason: str | None = None) -> str:
    return json.dumps({"object": "chat.completion.chunk", "model": "fault-model",
                       "choices": [{"index": 0, "delta": {"tool_calls": list(deltas)},
                                    "finish_reason": finish_reason}]})


def calls_stream(*calls: tuple[str, str, str]) -> Stream:
    """A reply that calls: per call its id and name once, then the arguments in three pieces."""
    steps = []
    for index, (call_id, name, arguments) in enumerate(calls):
        steps.append(tool_chunk({"index": index, "id": call_id, "type": "function",
                                 "function": {"name": name, "arguments": ""}}))
        third = max(1, len(arguments) // 3)
        for piece in (arguments[:third], arguments[third:2 * third], arguments[2 * third:]):
            steps.append(tool_chunk({"index": index, "function": {"arguments": piece}}))
    steps += [json.dumps({"object": "chat.completion.chunk", "model": "fault-model",
                          "choices": [{"index": 0, "delta": {},
                                       "finish_reason": "tool_calls"}]}), "[DONE]"]
    return Stream(steps)


def test_deltas_become_calls_and_a_nameless_or_unreadable_one_has_a_problem():
    assembler = CallAssembler()
    assembler.feed(({"index": 0, "id": "call_1", "function": {"name": "add", "arguments": '{"a": 2'}},))
    assembler.feed(({"index": 1, "id": "call_2", "function": {"arguments": "{}"}},))
    assembler.feed(({"index": 0, "function": {"arguments": ', "b": 3}'}},))
    added, nameless = assembler.calls()
    assert (added.id, added.name, added.arguments) == ("call_1", "add", {"a": 2, "b": 3})
    assert nameless.problem and "does not name a tool" in nameless.problem
    cut = CallAssembler()
    cut.feed(({"index": 0, "function": {"name": "add", "arguments": '{"a": 2'}},))
    assert cut.calls(complete=False)[0].incomplete


def test_the_history_goes_out_in_openai_shape_without_a_local_models_markup():
    call = ToolCall("abc123XYZ", "add", {"a": 2, "b": 3})
    local_reply = "Let me add.\n" + call_text("add", a=2, b=3)
    messages = [{"role": "user", "content": "2+3?"},
                {"role": "assistant", "content": local_reply, "tool_calls": [call.to_openai()]},
                {"role": "tool", "tool_call_id": "abc123XYZ", "name": "add", "content": "5"}]
    wire = wire_messages(messages)
    assert wire[1] == {"role": "assistant", "content": "Let me add.",
                       "tool_calls": [call.to_openai()]}
    assert wire[2] == {"role": "tool", "tool_call_id": "abc123XYZ", "content": "5"}
    assert tool_fields((ADD,), "add")["tool_choice"] == {"type": "function",
                                                          "function": {"name": "add"}}
    assert tool_fields((), "auto") == {}


def test_a_real_server_forced_to_call_streams_a_call_that_fits_the_schema(llama_server):  # noqa: F811
    client = RemoteClient(settings_for(llama_server, timeout_s=60.0))
    try:
        events = list(client.stream([{"role": "user", "content": "What is 2 plus 3?"}],
                                    Sampling(max_tokens=40, temperature=0.0, tools=(ADD,),
                                             tool_choice="add")))
    finally:
        client.close()
    done = events[-1]
    assert isinstance(done, Done), events[-1]
    (call,) = done.tool_calls
    assert call.name == "add" and call.runnable
    assert set(call.arguments) == {"a", "b"} and all(isinstance(v, int) for v in call.arguments.values())


def test_a_remote_call_goes_through_the_same_loop_and_wrong_arguments_are_an_error_result(tmp_path):
    (tmp_path / "notes.txt").write_text("tangerine")
    script = [calls_stream(("call_abc", "read_file", json.dumps({"wrong": 1})),
                           ("call_def", "read_file", json.dumps({"path": str(tmp_path / "notes.txt")}))),
              reply("It says ", "tangerine.")]
    config = Settings(tools=ToolsSettings(builtins=("read_file",)))
    engine = FakeEngine()
    engine.load()
    with FaultServer(script) as server, \
            ChatTools.open(config, ("*",), mcp_path=Path("/nonexistent/mcp.json")) as tools:
        escalator = Escalator.from_settings(settings_for(server.base_url))
        chat = ChatContext(engine)
        try:
            events = list(start(chat, "what is in notes.txt?", tools,
                                router=Escalation(escalator, engine, "remote")))
        finally:
            escalator.close()
        first, second = (r.body for r in server.requests)
    called = [e for e in events if isinstance(e, ToolCalled)]
    wrong, right = [e.result for e in events if isinstance(e, ToolReturned)]
    assert [c.label for c in called] == ["builtin.read_file"] * 2
    assert wrong.is_error and "input schema" in wrong.content and wrong.call_id == "call_abc"
    assert right.content == "tangerine" and not right.is_error
    assert events[-1].reply == "It says tangerine."
    assert first["tools"][0]["function"]["name"] == "read_file" and first["tool_choice"] == "auto"
    roles = [m["role"] for m in second["messages"]]
    assert roles[-4:] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in second["messages"][-3]["tool_calls"]] == ["call_abc", "call_def"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_def",
                                      "content": "tangerine"}
    assert engine.submitted == []  # the local model never answered


def test_a_remote_reply_with_too_many_calls_runs_only_the_first_sixteen(tmp_path):
    from localchat.chat.tool_rounds import MAX_CALLS_PER_REPLY

    many = [(f"call_{i}", "read_file", json.dumps({"path": str(tmp_path / f"{i}.txt")}))
            for i in range(MAX_CALLS_PER_REPLY + 3)]
    config = Settings(tools=ToolsSettings(builtins=("read_file",)))
    engine = FakeEngine()
    engine.load()
    with FaultServer([calls_stream(*many), reply("ok")]) as server, \
            ChatTools.open(config, ("*",), mcp_path=Path("/nonexistent/mcp.json")) as tools:
        escalator = Escalator.from_settings(settings_for(server.base_url))
        try:
            events = list(start(ChatContext(engine), "go", tools,
                                router=Escalation(escalator, engine, "remote")))
        finally:
            escalator.close()
    results = [e.result for e in events if isinstance(e, ToolReturned)]
    assert len(results) == MAX_CALLS_PER_REPLY + 3
    assert all("does not exist" in r.content for r in results[:MAX_CALLS_PER_REPLY])
    assert all("at most 16" in r.content for r in results[MAX_CALLS_PER_REPLY:])
    assert events[-1].reply == "ok"
