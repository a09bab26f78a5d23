"""The tool loop with the real test model: a forced call runs through the chat layer, the reply
after the result reuses the cache (only the result and the next header prefilled) and equals a
fresh prefill of the same messages (the greedy oracle), and a reopened session gives the model
the same history, so its next turn reuses the cache too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from oracle import assert_matches_fresh

from localchat.chat.conversation import Conversation
from localchat.chat.services import ChatServices
from localchat.chat.tools import ChatTools
from localchat.engine.options import Sampling
from localchat.events import Done, Token, ToolCalled, ToolReturned
from localchat.settings import ContextSection, Settings
from localchat.settings.tools import ToolsSettings

GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=64)


class _NoRemote:
    client = None

    def close(self) -> None:
        pass


def test_a_forced_call_runs_and_the_reply_after_it_prefills_only_the_result(engine, fresh, store,
                                                                            tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    config = Settings(context=ContextSection(summarize=False),
                      tools=ToolsSettings(builtins=("list_directory",)))
    with ChatTools.open(config, ("*",), mcp_path=Path("/nonexistent/mcp.json")) as tools:
        services = ChatServices(config, None, _NoRemote, tools)  # type: ignore[arg-type]
        conversation = Conversation(store, store.create_session(), services)
        conversation.attach(engine, GREEDY)
        conversation.tool_choice = "list_directory"
        turn = conversation.send(f"List the files in {tmp_path}.")
        events, reply = [], []
        for event in turn:
            events.append(event)
            if isinstance(event, ToolReturned):
                reply.clear()  # the tokens after the result are the reply to compare
            elif isinstance(event, Token):
                reply.append(event.token_id)
        done = events[-1]
        assert isinstance(done, Done), done
        called = next(e for e in events if isinstance(e, ToolCalled))
        returned = next(e for e in events if isinstance(e, ToolReturned))
        # It ran (a 135M model may well name a folder that is not there: an error it reads).
        assert called.label == "builtin.list_directory" and returned.call == called.call
        assert "denied" not in returned.result.content
        first = turn.rounds[0].done
        # Only the result and the next header were prefilled: the rest came from the cache.
        result_tokens = engine.count_tokens(returned.result.content)
        assert done.timings.cache_n >= first.timings.cache_n + first.timings.prompt_n
        assert result_tokens <= done.timings.prompt_n <= result_tokens + 24
        history = conversation.chat.model_messages()[:-1]  # before the reply
        sampling = replace(turn.sampling, tool_choice="auto")
        assert_matches_fresh(reply[:12], fresh, history, sampling)
        conversation.record_reply(done, engine.name)

        reopened = Conversation(store, store.session(conversation.session_id), services)
        reopened.attach(engine, GREEDY)
        assert reopened.chat.history == conversation.chat.history


def test_a_session_with_a_tool_round_reopens_from_its_snapshot_and_reuses_it(engine, store,
                                                                             tmp_path):
    from localchat.chat.snapshots import SessionSnapshots

    config = Settings(context=ContextSection(summarize=False),
                      tools=ToolsSettings(builtins=("list_directory",)))
    snapshots = SessionSnapshots.on_disk(tmp_path / "snapshots", 1 << 30)
    with ChatTools.open(config, ("*",), mcp_path=Path("/nonexistent/mcp.json")) as tools:
        services = ChatServices(config, snapshots, _NoRemote, tools)  # type: ignore[arg-type]
        conversation = Conversation(store, store.create_session(), services)
        conversation.attach(engine, GREEDY)
        conversation.tool_choice = "list_directory"
        turn = conversation.send("List the files here.")
        done = list(turn)[-1]
        assert isinstance(done, Done) and turn.rounds
        conversation.record_reply(done, engine.name)
        snapshots.flush()
        cached = engine.tokens_in_context

        engine.reset()  # as a new process would start
        reopened = Conversation(store, store.session(conversation.session_id), services)
        reopened.attach(engine, replace(GREEDY, max_tokens=4))
        reopened.restore_snapshot()
        assert reopened.take_notices() == []
        final = list(reopened.send("Thanks."))[-1]
        assert isinstance(final, Done)
        assert final.timings.cache_n >= cached - 1 and final.timings.restore_ms > 0


def test_a_message_typed_after_a_tool_round_is_prefilled_with_the_tools_and_reused(engine, fresh,
                                                                                  store):
    config = Settings(context=ContextSection(summarize=False),
                      tools=ToolsSettings(builtins=("list_directory",)))
    with ChatTools.open(config, ("*",), mcp_path=Path("/nonexistent/mcp.json")) as tools:
        services = ChatServices(config, None, _NoRemote, tools)  # type: ignore[arg-type]
        conversation = Conversation(store, store.create_session(), services)
        conversation.attach(engine, replace(GREEDY, max_tokens=16))
        conversation.tool_choice = "list_directory"
        done = list(conversation.send("List the files here."))[-1]
        assert isinstance(done, Done)
        conversation.record_reply(done, engine.name)
        conversation.tool_choice = "auto"

        chat = conversation.chat
        typed = "Now tell me which of them is the largest one."
        messages = chat.draft_messages(typed)  # what prefill-while-typing lays down
        assert messages is not None and chat.offered_tools
        prepared = engine.prepare(messages, chat.offered_tools).wait(60)
        assert isinstance(prepared, Done) and prepared.finish_reason == "stop"
        in_cache = engine.tokens_in_context

        turn = conversation.send(typed)
        events = list(turn)
        final = events[-1]
        assert isinstance(final, Done)
        first = turn.rounds[0].done if turn.rounds else final
        # Only the reply's header was left to prefill: the tools rendered as the turn renders them.
        assert first.timings.cache_n >= in_cache - 1 and first.timings.prompt_n <= 8
        reply = []
        for event in events:
            if isinstance(event, (ToolCalled, ToolReturned)):
                break
            if isinstance(event, Token):
                reply.append(event.token_id)
        if not turn.rounds:  # it answered (a second call would be another reply to compare)
            assert_matches_fresh(reply[:12], fresh, chat.last_sent, turn.sampling)


def test_the_first_message_typed_is_prefilled_with_the_tools_it_will_offer(engine, fresh, store):
    config = Settings(context=ContextSection(summarize=False),
                      tools=ToolsSettings(builtins=("list_directory", "read_file")))
    with ChatTools.open(config, ("*",), mcp_path=Path("/nonexistent/mcp.json")) as tools:
        tools.registry.wait_started(30)
        services = ChatServices(config, None, _NoRemote, tools)  # type: ignore[arg-type]
        conversation = Conversation(store, store.create_session(), services)
        conversation.attach(engine, replace(GREEDY, max_tokens=8))
        chat = conversation.chat
        assert chat is not None and not chat.offered_tools  # no turn yet
        typed = "Which files are in this folder?"
        messages = chat.draft_messages(typed)
        assert messages is not None and len(chat.tools_for_prefill()) == 2
        prepared = engine.prepare(messages, chat.tools_for_prefill()).wait(60)
        assert isinstance(prepared, Done) and prepared.finish_reason == "stop"
        in_cache = engine.tokens_in_context

        conversation.tool_choice = "none"
        assert chat.tools_for_prefill() == ()  # a session that offers none renders none
        conversation.tool_choice = "auto"
        turn = conversation.send(typed)
        events = list(turn)
        first = turn.rounds[0].done if getattr(turn, "rounds", None) else events[-1]
        assert isinstance(first, Done)
        # The tool descriptions were in the cache before the message was sent.
        assert first.timings.cache_n >= in_cache - 1 and first.timings.prompt_n <= 8
