"""The app over the real engine and the test model (SmolLM2-135M): a reply streams and Esc
stops it mid-stream; the partial reply is kept, and the next turn reuses the KV cache."""

from __future__ import annotations

import threading

import pytest
from fake_engine import SIZE, command, send, wait_until

from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.store import Store
from localchat.tui.app import LocalChatApp
from localchat.tui.status import render_status

pytestmark = pytest.mark.model

SLOW = 120.0  # seconds; a shared 2-core machine can be slow, the test never waits for a fixed time
MAX_TOKENS = 400  # greedy SmolLM2 writes the dragon story to this limit: it is running at Esc


def finished(app: LocalChatApp) -> bool:
    reply = app.chat_log.last_reply()
    return app.turns.current is None and reply is not None and reply.finished


async def test_the_real_model_streams_stops_on_esc_and_the_next_turn_reuses_the_cache(test_model_path):
    with Store.open() as store:
        app = LocalChatApp(
            store=store,
            engine_factory=lambda ref: Engine(test_model_path, EngineOptions(n_ctx=1024), name="smollm2-135m"),
            sampling_factory=lambda: Sampling(temperature=0.0, max_tokens=MAX_TOKENS, seed=0),
            list_models=list,
        )
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            assert render_status(app.status.info)[0].startswith("smollm2-135m · CPU │ idle │ ctx ")

            await send(pilot, "Write a long story about a dragon who learns to cook.")
            await wait_until(pilot, lambda: app.chat_log.last_reply().text, "the story to start", timeout=SLOW)
            await pilot.press("escape")
            await wait_until(pilot, lambda: finished(app), "the stop", timeout=SLOW)
            story = app.chat_log.last_reply()
            assert story.has_class("-stopped") and story.text
            assert app.status.info.state == "stopped"

            await send(pilot, "What is the capital of France? Answer in one word.")
            await wait_until(pilot, lambda: finished(app), "the answer", timeout=SLOW)
            assert app.chat_log.last_reply().text.strip()
            assert "TTFT – ms" not in render_status(app.status.info)[1]

        turns = store.turns(store.last_session().id)
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    stopped, answer = turns[1], turns[3]
    assert stopped.stopped and stopped.finish_reason == "aborted" and stopped.content == story.text
    assert 0 < stopped.timings.predicted_n < MAX_TOKENS
    assert answer.model == "smollm2-135m" and not answer.stopped
    # The story, stopped or not, was still in the KV cache: only the new question was prefilled.
    assert answer.timings.cache_n > 0
    assert answer.timings.prompt_n < answer.timings.cache_n


def real_app(store, test_model_path, **kwargs) -> LocalChatApp:
    kwargs.setdefault("engine_factory",
                      lambda ref: Engine(test_model_path, EngineOptions(n_ctx=1024), name="smollm2-135m"))
    return LocalChatApp(
        store=store,
        sampling_factory=lambda: Sampling(temperature=0.0, max_tokens=16, seed=0),
        list_models=list,
        **kwargs,
    )


async def test_reopened_session_restores_its_kv_cache_instead_of_prefilling(test_model_path):
    with Store.open() as store:
        app = real_app(store, test_model_path)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            await send(pilot, "My name is Ada and I live in Lisbon.")
            await wait_until(pilot, lambda: finished(app), "the reply", timeout=SLOW)
        app = real_app(store, test_model_path, continue_last=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            await send(pilot, "Where do I live?")
            await wait_until(pilot, lambda: finished(app), "the reply", timeout=SLOW)
        turns = store.turns(store.last_session().id)
    first, reopened = turns[1].timings, turns[3].timings
    assert reopened.restore_ms > 0
    assert reopened.cache_n >= first.n_ctx_used  # everything before was restored, not prefilled
    assert reopened.prompt_n < 25


async def test_big_sends_the_message_to_the_remote_model(test_model_path, llama_server, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(f'[remote]\nmode = "ask"\nbase_url = "{llama_server}"\n')
    with Store.open() as store:
        app = real_app(store, test_model_path)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            await send(pilot, "/big Say hello in French.")
            await wait_until(pilot, lambda: finished(app), "the remote reply", timeout=SLOW)
            assert app.status.info.route == "remote"
        (_, reply) = store.turns(store.last_session().id)
    assert reply.route == "remote" and reply.route_reason == "user: remote" and reply.content


async def test_type_ahead_and_prefill_while_typing_with_the_real_model(test_model_path):
    from localchat.tui.chat_log import QueuedPrompt

    gate = threading.Event()

    def slow_to_load(ref):
        gate.wait()  # "still loading" for as long as the test needs
        return Engine(test_model_path, EngineOptions(n_ctx=2048), name="smollm2-135m")

    draft = " ".join(f"Item {i} is a {['red', 'blue'][i % 2]} cup." for i in range(60)) + " Which items are red?"
    with Store.open() as store:
        app = real_app(store, test_model_path, engine_factory=slow_to_load)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Hello!")
            await send(pilot, "How are you?")
            assert [q.text for q in app.chat_log.query(QueuedPrompt)] == ["Hello!", "How are you?"]
            gate.set()
            await wait_until(pilot, lambda: len(store.turns(store.last_session().id)) == 4 and finished(app),
                             "both queued messages answered", timeout=SLOW)
            assert not app.chat_log.query(QueuedPrompt)

            app.prompt.text = draft  # a paste: prefilled in the background while it sits there
            chat = app.conversation.chat
            await wait_until(pilot, lambda: chat.draft.cached_text == draft, "the draft prefill", timeout=SLOW)
            await pilot.press("enter")
            await wait_until(pilot, lambda: finished(app), "the answer", timeout=SLOW)
        turns = store.turns(store.last_session().id)
    assert [t.content for t in turns[::2]] == ["Hello!", "How are you?", draft]
    assert turns[-1].timings.prompt_n <= 5  # only the reply header: the draft was already in the cache
    assert turns[-1].timings.cache_n > 300


async def test_a_message_mentioning_a_file_is_prefilled_with_it_and_enter_evaluates_only_the_reply_header(
        test_model_path, fresh, tmp_path, monkeypatch):
    """The ``@file`` is part of what is prefilled while typing, so Enter reuses all of it, and
    the reply is what a fresh prefill of the same messages gives (the oracle)."""
    from oracle import GREEDY, assert_matches_fresh

    from localchat.engine import engine as engine_module
    from localchat.engine.turn import TurnHandle
    from localchat.events import Token

    replies: list[list[int]] = []

    class Recorded(TurnHandle):  # keeps each turn's sampled token ids, for the oracle
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.token_ids: list[int] = []
            replies.append(self.token_ids)

        def emit(self, event) -> None:
            if isinstance(event, Token) and event.token_id >= 0:
                self.token_ids.append(event.token_id)
            super().emit(event)

    monkeypatch.setattr(engine_module, "TurnHandle", Recorded)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cups.txt").write_text(
        "\n".join(f"Cup {i} is {['red', 'blue', 'green'][i % 3]}." for i in range(40)) + "\n")
    message = "Which cups are green? The list is in @cups.txt"
    with Store.open() as store:
        app = LocalChatApp(
            store=store,
            engine_factory=lambda ref: Engine(test_model_path, EngineOptions(n_ctx=2048), name="smollm2-135m"),
            sampling_factory=lambda: GREEDY, list_models=list)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            chat = app.conversation.chat
            app.prompt.text = message  # a paste: prefilled at once
            await wait_until(pilot, lambda: "Cup 39 is red." in chat.draft.cached_text
                             and chat.draft.cached_text.endswith(message), "the draft prefill", timeout=SLOW)
            await pilot.press("enter")
            await wait_until(pilot, lambda: finished(app), "the answer", timeout=SLOW)
            sent = chat.last_sent
        (question, answer) = store.turns(store.last_session().id)
    assert question.content == sent[-1]["content"] == chat.draft.cached_text
    assert answer.timings.prompt_n <= 5  # only the reply header: the file was already in the cache
    assert answer.timings.cache_n > 300
    assert_matches_fresh(next(r for r in reversed(replies) if r), fresh, sent)


async def test_format_makes_the_real_model_answer_in_the_schema_s_shape(test_model_path):
    """``/format`` with a short form: the reply is drawn as a JSON block, parses, has the shape,
    and is stored as it came; the next message, after ``/format off``, is free again (the small
    model may well copy its JSON again: the grammar judged none of its tokens)."""
    import json

    from textual.widgets._markdown import MarkdownFence

    from localchat.formats import read_schema
    from localchat.formats.validate import schema_problem

    with Store.open() as store:
        app = LocalChatApp(
            store=store,
            engine_factory=lambda ref: Engine(test_model_path, EngineOptions(n_ctx=1024), name="smollm2-135m"),
            sampling_factory=lambda: Sampling(temperature=0.0, max_tokens=120, seed=0),
            list_models=list,
        )
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            await command(pilot, "/format name, age int, city")
            await send(pilot, "Describe a person.")
            await wait_until(pilot, lambda: finished(app), "the answer", timeout=SLOW)
            reply = app.chat_log.last_reply()
            assert [f.lexer for f in reply.body.query(MarkdownFence)] == ["json"]
            await command(pilot, "/format off")
            await send(pilot, "Thanks!")
            await wait_until(pilot, lambda: finished(app) and len(app.chat_log.messages()) == 4,
                             "the second answer", timeout=SLOW)
        turns = store.turns(store.last_session().id)
    answer = json.loads(turns[1].content)
    assert schema_problem(answer, read_schema("name, age int, city")) is None
    assert turns[1].timings.constrained_n > 0
    assert turns[3].content and turns[3].timings.constrained_n == 0  # free again


async def test_the_real_model_forced_to_call_a_tool_asks_runs_and_answers(test_model_path, tmp_path):
    from localchat.chat.services import build_services
    from localchat.chat.tools import ChatTools
    from localchat.settings import Settings
    from localchat.settings.tools import ToolsSettings
    from localchat.tui.approval import ApprovalScreen
    from localchat.tui.tool_calls import ToolCallView

    (tmp_path / "alpha.txt").write_text("alpha")
    config = Settings(tools=ToolsSettings(builtins=("list_directory",)))

    def services(**options):
        made = build_services(config, tools=False, **options)
        made.tools = ChatTools.open(config, mcp_path=tmp_path / "none.json")  # ended by the app
        return made

    with Store.open() as store:
        app = LocalChatApp(
            store=store,
            engine_factory=lambda ref: Engine(test_model_path, EngineOptions(n_ctx=2048), name="smollm2-135m"),
            # Room for the whole call: its JSON holds tmp_path, whose length (pytest-NNN) grows
            # run after run; 48 tokens cut it in 1 run of 6 (an error result, no question asked).
            sampling_factory=lambda: Sampling(temperature=0.0, max_tokens=128, seed=0),
            list_models=list, services_factory=services,
        )
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load", timeout=SLOW)
            await command(pilot, "/tools list_directory")  # a 135M model calls only when made to
            assert app.conversation.tool_choice == "list_directory"
            await send(pilot, f"List the files in {tmp_path}.")
            await wait_until(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the question",
                             timeout=SLOW)
            assert app.screen.request.tool.label == "builtin.list_directory"
            await pilot.press("y")
            await wait_until(pilot, lambda: finished(app), "the answer after the result", timeout=SLOW)
            reply = app.chat_log.last_reply()
            [view] = reply.query(ToolCallView)
            assert view.line.startswith("⚙ builtin.list_directory(") and view.result is not None
            assert "denied" not in view.result.content  # it ran (a wrong folder is an error it reads)
            await pilot.pause()
            shown = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
            # Neither the call's marker nor its JSON reached the text (what the model says after
            # the result is its own: a 135M model may well imitate a tool's answer).
            assert "<tool_call>" not in shown and "<tool_call>" not in reply.text
            assert not list(reply.query("RoundText"))  # forced: the call was all the first reply
        turns = store.turns(store.last_session().id)
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1].tool_calls[0].name == "list_directory"
