"""The chat's tool loop (chat/tool_rounds.py) over a scripted engine whose replies call tools, with
localchat's real built-in tools: every call shown, approved (or denied) before it runs, its result
given back, the next reply in the same turn; the limits; Esc; storage, reopen and export."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from localchat.chat.conversation import Conversation
from localchat.chat.services import ChatServices
from localchat.chat.tool_rounds import ToolTurn, start
from localchat.chat.tools import ChatTools
from localchat.context.chat_context import ChatContext
from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.events import Done, Failed, Notice, ToolApproval, ToolCalled, ToolReturned
from localchat.settings import Settings
from localchat.settings.tools import ToolsSettings
from localchat.store import Store
from localchat.tools import Decision
from tests.calling_engine import CallingEngine, call_text

BUILTINS = ("read_file", "list_directory", "run_command")


def tools_for(allow=("*",), **settings) -> ChatTools:
    config = Settings(tools=ToolsSettings(builtins=BUILTINS, **settings))
    return ChatTools.open(config, allow, mcp_path=Path("/nonexistent/mcp.json"))


def engine_with(*replies: str) -> CallingEngine:
    """A model that answers with ``replies`` in turn, the last one from then on."""
    def script(messages):
        since_user = next(i for i, m in enumerate(reversed(messages)) if m["role"] == "user")
        return replies[min(since_user // 2, len(replies) - 1)]

    engine = CallingEngine(reply=script)
    engine.load()
    return engine


def run(turn) -> list:
    events = list(turn)
    assert isinstance(events[-1], (Done, Failed))
    return events


def test_a_call_is_shown_run_and_its_result_goes_back_before_the_next_reply(tmp_path):
    (tmp_path / "notes.txt").write_text("the secret word is tangerine")
    engine = engine_with(call_text("read_file", path=str(tmp_path / "notes.txt")),
                         "It says tangerine.")
    chat = ChatContext(engine)
    with tools_for() as tools:
        turn = start(chat, "what does notes.txt say?", tools)
        events = run(turn)
    kinds = [type(e).__name__ for e in events if not type(e).__name__.startswith(("Token", "Prefill"))]
    assert kinds == ["ToolCalled", "ToolReturned", "Done"]
    called, returned, done = [e for e in events if isinstance(e, (ToolCalled, ToolReturned, Done))]
    assert called.label == "builtin.read_file"
    assert "tangerine" in returned.result.content and not returned.result.is_error
    assert done.reply == "It says tangerine." and done.tool_calls == ()
    # The sampling offered the tools; the second reply saw the call and its result.
    assert {s["function"]["name"] for s in engine.samplings[0].tools} == set(BUILTINS)
    second = engine.submitted[1]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert second[1]["tool_calls"][0]["function"]["name"] == "read_file"
    assert second[2]["tool_call_id"] == second[1]["tool_calls"][0]["id"]
    assert [m.role for m in chat.history] == ["user", "assistant", "tool", "assistant"]
    assert [r.message.role for r in turn.rounds] == ["assistant", "tool"]


def test_approval_is_asked_and_a_denied_call_never_runs(tmp_path):
    target = tmp_path / "created"
    engine = engine_with(call_text("run_command", command=f"touch {target}"), "Alright.")
    chat = ChatContext(engine)
    with tools_for(allow=()) as tools:
        events = []
        for event in start(chat, "make a file", tools):
            events.append(event)
            if isinstance(event, ToolApproval):
                assert "run_command" in event.request.line and str(target) in event.request.line
                event.request.answer(Decision.DENY)
    returned = next(e for e in events if isinstance(e, ToolReturned))
    assert returned.result.content == "denied by the user" and returned.result.is_error
    assert not target.exists()
    assert chat.history[2].content == "denied by the user"


def test_an_approval_answered_from_another_thread_lets_the_call_run(tmp_path):
    target = tmp_path / "created"
    engine = engine_with(call_text("run_command", command=f"touch {target}"), "Done.")
    chat = ChatContext(engine)
    with tools_for(allow=()) as tools:
        for event in start(chat, "make a file", tools):
            if isinstance(event, ToolApproval):
                threading.Timer(0.05, event.request.answer, (Decision.ONCE,)).start()
    assert target.exists()


def test_esc_while_a_question_waits_denies_it_and_ends_the_turn_with_a_plain_stopped_reply(tmp_path):
    target = tmp_path / "created"
    calling = call_text("run_command", command=f"touch {target}")
    engine = engine_with(calling, "never")
    chat = ChatContext(engine)
    with tools_for(allow=()) as tools:
        turn = start(chat, "make a file", tools)
        events = []
        for event in turn:
            events.append(event)
            if isinstance(event, ToolApproval):
                threading.Timer(0.05, turn.stop).start()
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "aborted" and done.tool_calls == ()
    assert not target.exists() and len(engine.submitted) == 1
    last = chat.history[-1]
    assert last.role == "assistant" and last.stopped and last.tool_calls == () and last.content == calling
    assert turn.rounds == []


def test_esc_during_a_running_call_cancels_it(tmp_path):
    engine = engine_with(call_text("run_command", command="sleep 30"), "never")
    chat = ChatContext(engine)
    with tools_for() as tools:
        turn = start(chat, "wait", tools)
        for event in turn:
            if isinstance(event, ToolCalled):
                threading.Timer(0.2, turn.stop).start()
    assert isinstance(turn.result, Done) and turn.result.finish_reason == "aborted"
    assert turn.marks["tool_end"][0] - turn.marks["tool_start"][0] < 5


def test_the_rounds_limit_is_shown_and_the_model_answers_with_what_it_has(tmp_path):
    engine = engine_with(call_text("list_directory", path=str(tmp_path)))  # calls forever
    chat = ChatContext(engine)
    with tools_for(max_rounds=2) as tools:
        turn = start(chat, "list it", tools)
        events = run(turn)
    returned = [e for e in events if isinstance(e, ToolReturned)]
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(returned) == 3 and "limit of 2" in returned[2].result.content
    assert any("limit of 2 was reached" in n for n in notices)
    assert any("still asked for tools" in n for n in notices)
    done = events[-1]
    assert done.tool_calls == () and chat.history[-1].tool_calls == ()
    assert len(engine.submitted) == 4


def test_a_call_to_a_missing_tool_or_with_wrong_arguments_is_an_error_the_model_reads(tmp_path):
    engine = engine_with(call_text("no_such_tool") + call_text("read_file", wrong=1), "Sorry.")
    chat = ChatContext(engine)
    with tools_for() as tools:
        events = run(start(chat, "go", tools))
    missing, wrong = [e.result for e in events if isinstance(e, ToolReturned)]
    assert missing.is_error and "no tool named no_such_tool" in missing.content
    assert wrong.is_error and "input schema" in wrong.content
    assert events[-1].reply == "Sorry."


def test_no_tools_configured_is_a_plain_turn_and_tool_choice_is_checked(tmp_path):
    engine = engine_with("Hello.")
    chat = ChatContext(engine)
    empty = ChatTools.empty()
    turn = start(chat, "hi", empty)
    assert not isinstance(turn, ToolTurn) and run(turn)[-1].reply == "Hello."
    assert engine.samplings[0].tools == ()
    with pytest.raises(UserError, match="no tools are available"):
        empty.offer(Sampling(), "required")
    with tools_for() as tools:
        assert tools.offer(Sampling(), "none").tools == ()
        assert tools.offer(Sampling(), "read_file").tool_choice == "read_file"
        with pytest.raises(UserError, match="no such tool"):
            tools.offer(Sampling(), "delete_everything")


def test_calls_and_results_are_stored_with_the_session_reopened_and_exported(tmp_path):
    (tmp_path / "notes.txt").write_text("tangerine")
    engine = engine_with(call_text("read_file", path=str(tmp_path / "notes.txt")), "Tangerine.")
    config = Settings(tools=ToolsSettings(builtins=BUILTINS))
    with Store.open(tmp_path / "db.sqlite") as store, tools_for() as tools:
        services = ChatServices(config, None, lambda: None, tools)  # type: ignore[arg-type, return-value]
        services.new_escalator = lambda: _NoRemote()  # type: ignore[assignment]
        session = store.create_session()
        conversation = Conversation(store, session, services)
        conversation.attach(engine)
        handle = conversation.send("what is in notes.txt?")
        final = run(handle)[-1]
        conversation.record_reply(final, engine.name)
        history = list(conversation.chat.history)
        turns = store.turns(session.id)
        assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
        assert turns[1].tool_calls[0].name == "read_file" and turns[1].answer == ""
        assert turns[2].tool_label == "builtin.read_file" and turns[2].content == "tangerine"

        reopened = Conversation(store, store.session(session.id), services)
        reopened.attach(engine)
        assert reopened.chat.history == history
        document = json.loads(reopened.to_json())
        assert document["messages"][1]["tool_calls"][0]["function"]["name"] == "read_file"
        assert document["messages"][2]["role"] == "tool"
        markdown = reopened.to_markdown()
        assert "⚙ builtin.read_file" in markdown and "tangerine" in markdown


class _NoRemote:
    client = None

    def close(self) -> None:
        pass


def test_while_a_session_offers_tools_a_background_prefill_renders_them_too(tmp_path):
    engine = engine_with("Hello.")
    chat = ChatContext(engine)
    with tools_for() as tools:
        run(start(chat, "hi", tools))
    # The next turn will offer the same tools: a draft or a new system prompt prefilled in the
    # background renders them, so that turn reuses it.
    assert chat.offered_tools and chat.draft_messages("next") is not None
    assert chat.set_system("Be brief.") is not None
    assert engine.prepared_tools == [chat.offered_tools]
