"""Tool calls in the app (headless, scripted model and tool round: tests/fake_tools.py): the
approval prompt and its keys, the ⚙ lines with their results folded under them, Esc cancelling
a running call, hostile arguments and results shown inert."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fake_engine import (
    FakeEngine,
    command,
    make_app,
    notices,
    ready,
    reply_finished,
    screen_lines,
    send,
    wait_until,
)
from fake_tools import ToolRound, tool

from localchat import paths
from localchat.chat.services import build_services
from localchat.chat.tools import ChatTools
from localchat.reply.calls import ToolCall
from localchat.settings import Settings
from localchat.settings.tools import ToolsSettings
from localchat.tools import ServerStatus, ToolRegistry
from localchat.tools.approval import ApprovalPolicy, Decision
from localchat.tools.results import denied_result
from localchat.tui.approval import ApprovalScreen
from localchat.tui.reply_view import ReplyView, RoundText
from localchat.tui.tool_calls import ToolCallView
from localchat.tui.tool_servers import status_notice
from tests.calling_engine import CallingEngine, call_text

SIZE = (100, 30)
READ = tool("read_file", "files", "Read a text file.\nMore detail.")
RUN = tool("run_command", "builtin", "Run a shell command.")


def read(path: str, call_id: str = "call00001") -> tuple[ToolCall, object]:
    return ToolCall(call_id, "read_file", {"path": path}), READ


def app_with(store, round_: ToolRound, reply: str = "Let me look."):
    return make_app(store, FakeEngine(reply=reply, tools=round_))


def views(app) -> list[ToolCallView]:
    reply = app.chat_log.last_reply()
    assert isinstance(reply, ReplyView)
    return list(reply.query(ToolCallView))


@asynccontextmanager
async def started(store, round_: ToolRound, prompt: str):
    """A pilot on an app whose scripted model answers ``prompt`` with ``round_``, entered once
    the first question is up (when ``round_`` has a policy) or the turn has started."""
    app = app_with(store, round_)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, prompt)
        if round_.policy is not None:
            await asked(pilot)
        yield pilot


async def screen_text(pilot) -> str:
    """The screen once what changed has been drawn."""
    await pilot.pause()
    return "\n".join(screen_lines(pilot.app))


async def screen_showing(pilot, condition, what: str, timeout: float = 10.0) -> str:
    """The screen once ``condition(text)`` holds for what it shows (a change is drawn on a later
    refresh than the one that follows it: one pause is not always enough)."""
    deadline = time.monotonic() + timeout
    while not condition(shown := await screen_text(pilot)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for the screen to show {what}:\n{shown}")
        await asyncio.sleep(0.02)
    return shown


async def asked(pilot, after: ApprovalScreen | None = None) -> ApprovalScreen:
    """The approval prompt on top, once one is up (a new one when ``after`` is the one answered:
    that one stays on top until the app has taken the answer)."""
    def up() -> bool:
        return isinstance(pilot.app.screen, ApprovalScreen) and pilot.app.screen is not after

    await wait_until(pilot, up, "the approval prompt")
    await pilot.pause()
    return pilot.app.screen


async def test_a_call_shows_as_one_line_with_its_result_folded_under_it(store):
    round_ = ToolRound([read("notes.txt")], then="The notes say hi.",
                       results={"read_file": "hi there\nsecond line"})
    async with started(store, round_, "What do my notes say?") as pilot:
        app = pilot.app
        await reply_finished(pilot)

        reply = app.chat_log.last_reply()
        [earlier] = reply.query(RoundText)
        assert earlier.source == "Let me look."  # the text before the call stays above it
        [view] = views(app)
        assert view.state == "done" and view.collapsed
        assert view.line == '⚙ files.read_file({"path": "notes.txt"})'
        assert "✓ 2 lines" in str(view.title)
        assert reply.text == "The notes say hi."  # the next round streamed below the call
        shown = await screen_text(pilot)
        assert '⚙ files.read_file({"path": "notes.txt"})' in shown
        assert "second line" not in shown  # folded

        view.collapsed = False  # a click on the line, or Enter on it
        await pilot.pause()
        assert "second line" in await screen_text(pilot)
        assert round_.log == [("call00001", "ran")]
        order = [type(w).__name__ for w in reply.children]
        assert order.index("RoundText") < order.index("ToolCallView") < order.index("LiveMarkdown")


async def test_y_runs_the_call_once_and_the_next_call_asks_again(store):
    round_ = ToolRound([read("a.txt", "call00001"), read("b.txt", "call00002")],
                       policy=ApprovalPolicy())
    async with started(store, round_, "Read both.") as pilot:
        app = pilot.app
        screen = await asked(pilot)
        shown = await screen_text(pilot)
        assert "read_file · server files" in shown and '"path": "a.txt"' in shown
        assert "Read a text file." in shown and "More detail" not in shown
        assert "y once   a always this session   s always, saved   n/Esc deny" in shown
        assert views(app)[0].state == "asking"
        assert app.status.info.state == "waiting for your answer"

        await pilot.press("y")
        second = await asked(pilot, after=screen)
        assert second is not screen and '"path": "b.txt"' in await screen_text(pilot)
        await pilot.press("y")
        await reply_finished(pilot)
        assert round_.log == [("call00001", "once"), ("call00001", "ran"),
                              ("call00002", "once"), ("call00002", "ran")]
        assert [v.state for v in views(app)] == ["done", "done"]


async def test_the_question_shows_the_whole_call_however_long_its_command(store):
    # A long command's tail was hidden behind "… N more characters": what is approved must be
    # all there to read (the box scrolls).
    command_ = "echo " + "a" * 4000 + "; touch ~/.marker"
    round_ = ToolRound([(ToolCall("call00001", "run_command", {"command": command_}), RUN)],
                       policy=ApprovalPolicy())
    async with started(store, round_, "Echo it.") as pilot:
        assert "touch" not in await screen_text(pilot)  # below the fold at first
        await pilot.press("end")
        shown = await screen_showing(pilot, lambda text: "touch ~/.marker" in text, "the command's tail")
        assert "more characters" not in shown
        await pilot.press("n")
        await reply_finished(pilot)
        assert round_.log == [("call00001", "deny")]


async def test_a_allows_the_tool_for_the_session_and_asks_no_more(store):
    round_ = ToolRound([read("a.txt", "call00001"), read("b.txt", "call00002")],
                       policy=ApprovalPolicy())
    async with started(store, round_, "Read both.") as pilot:
        app = pilot.app
        await pilot.press("a")
        await reply_finished(pilot)
        assert round_.log == [("call00001", "session"), ("call00001", "ran"), ("call00002", "ran")]
        assert any("files.read_file: allowed until localchat exits" in n for n in notices(app))


async def test_a_for_run_command_covers_only_that_exact_command_and_cannot_be_saved(store):
    calls = [(ToolCall("call00001", "run_command", {"command": "ls"}), RUN),
             (ToolCall("call00002", "run_command", {"command": "ls"}), RUN),
             (ToolCall("call00003", "run_command", {"command": "rm -rf x"}), RUN)]
    round_ = ToolRound(calls, policy=ApprovalPolicy())
    async with started(store, round_, "List, then delete.") as pilot:
        app = pilot.app
        shown = await screen_text(pilot)
        assert "a always this exact command" in shown and "s always, saved" not in shown
        await pilot.press("s")  # not offered: nothing happens
        await pilot.pause()
        assert isinstance(app.screen, ApprovalScreen)
        first = app.screen
        await pilot.press("a")
        await asked(pilot, after=first)  # rm is a different command: asked again
        assert '"command": "rm -rf x"' in await screen_text(pilot)
        await pilot.press("n")
        await reply_finished(pilot)
        assert round_.log == [("call00001", "session"), ("call00001", "ran"), ("call00002", "ran"),
                              ("call00003", "deny")]
        assert [v.state for v in views(app)] == ["done", "done", "denied"]


async def test_s_saves_always_allow_in_config_toml(store):
    round_ = ToolRound([read("a.txt")], policy=ApprovalPolicy())
    async with started(store, round_, "Read it.") as pilot:
        app = pilot.app
        await pilot.press("s")
        await reply_finished(pilot)
        assert round_.log == [("call00001", "save"), ("call00001", "ran")]
        assert any("always allowed (saved in" in n for n in notices(app))
    saved = paths.config_file().read_text(encoding="utf-8")
    assert "always_allow" in saved and "read_file" in saved


async def test_n_and_esc_deny_and_the_model_goes_on(store):
    for key in ("n", "escape"):
        round_ = ToolRound([read("secret.txt")], then="I could not read it.", policy=ApprovalPolicy())
        async with started(store, round_, "Read it.") as pilot:
            app = pilot.app
            await pilot.press(key)
            await reply_finished(pilot)
            [view] = views(app)
            assert view.state == "denied" and view.has_class("-error")
            assert "✖ denied" in str(view.title)
            reply = app.chat_log.last_reply()
            assert reply.text == "I could not read it." and not reply.has_class("-stopped")
            assert round_.log == [("call00001", "deny")], key


async def test_esc_during_a_running_call_cancels_it_and_stops_the_reply(store):
    round_ = ToolRound([read("huge.txt")], hold_call=True)
    async with started(store, round_, "Read it.") as pilot:
        app = pilot.app
        await wait_until(pilot, round_.running.is_set, "the call to run")
        await wait_until(pilot, lambda: bool(views(app)) and views(app)[0].state == "running",
                         "the running call on screen")
        assert "running…" in str(views(app)[0].title)
        await pilot.press("escape")
        await reply_finished(pilot)
        [view] = views(app)
        assert view.state == "stopped" and view.has_class("-error") and "✖ stopped" in str(view.title)
        assert round_.log == [("call00001", "cancelled")]
        reply = app.chat_log.last_reply()
        assert reply.has_class("-stopped")
        # The turn ends with the reply that called: its text stays above the call, once.
        assert [t.source for t in reply.query(RoundText)] == ["Let me look."] and reply.text == ""


async def test_ctrl_c_while_asking_denies_and_stops(store):
    round_ = ToolRound([read("a.txt")], policy=ApprovalPolicy())
    async with started(store, round_, "Read it.") as pilot:
        app = pilot.app
        await pilot.press("ctrl+c")
        await reply_finished(pilot)
        assert not isinstance(app.screen, ApprovalScreen)
        assert round_.log == [("call00001", "deny")]
        assert app.chat_log.last_reply().has_class("-stopped")


async def test_a_reply_that_ends_in_its_own_done_before_the_round_shows_the_same(store):
    round_ = ToolRound([read("notes.txt")], then="Here it is.", round_done=True)
    async with started(store, round_, "Read it.") as pilot:
        app = pilot.app
        await reply_finished(pilot)
        reply = app.chat_log.last_reply()
        assert [t.source for t in reply.query(RoundText)] == ["Let me look."]
        assert [v.state for v in views(app)] == ["done"]
        assert reply.text == "Here it is."
    assert store.turns(store.last_session().id)[-1].content == "Here it is."


async def test_failures_are_marked_and_told_and_hostile_text_is_inert(store):
    hostile = ToolCall("call00001", "read_file", {"path": "[bold red]x[/] \x1b[31mred\x1b[0m"})
    broken = ToolCall("call00002", "read_file", problem="the arguments are not valid JSON")
    round_ = ToolRound([(hostile, READ), (broken, READ)],
                       results={"read_file": RuntimeError("server crashed")})
    async with started(store, round_, "Read it.") as pilot:
        app = pilot.app
        await reply_finished(pilot)
        first, second = views(app)
        assert first.has_class("-error") and first.state == "failed"
        assert "[bold red]x[/]" in first.line and "\x1b" not in first.line and "\\u001b[31m" in first.line
        assert second.has_class("-error") and "not valid JSON" in second.result.content
        shown = await screen_text(pilot)
        assert "[bold red]x[/]" in shown and "\x1b" not in shown
        told = notices(app)
        assert any("server crashed" in n for n in told) and any("not valid JSON" in n for n in told)


# --- the tool servers at open ------------------------------------------------------------------

SERVER = str(Path(__file__).with_name("mcp_servers.py"))


def registry_for(folder: Path, servers: dict, **tools) -> ToolRegistry:
    path = folder / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return ToolRegistry.from_config(Settings(tools=ToolsSettings(**tools)), path)


def services_with(tools: ChatTools):
    def factory(**options):
        services = build_services(Settings(), tools=False, **options)
        services.tools = tools
        return services
    return factory


async def test_servers_start_in_the_background_and_their_progress_shows_as_notices(store, tmp_path):
    silent = {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"]}
    registry = registry_for(tmp_path, {
        "tools": {"command": sys.executable, "args": [SERVER, "stdio"]},
        "broken": {"command": sys.executable,
                   "args": ["-c", "import sys; sys.stderr.write('boom: no API key set\\n'); sys.exit(2)"]},
        "missing": {"command": "no-such-mcp-server-program"},
        "silent": silent,
    }, start_timeout_s=20)
    # The app's services own the servers: they end when it closes.
    tools = ChatTools(registry, ApprovalPolicy())
    app = make_app(store, FakeEngine(reply="Hi."), services_factory=services_with(tools))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        # Start-up waited for none of them: a message is answered while one still starts.
        await send(pilot, "Hello")
        await reply_finished(pilot)
        assert any(s.state == "starting" for s in registry.statuses() if s.name == "silent")
        assert any("server 'missing'" in n and "no-such-mcp-server-program" in n
                   for n in notices(app))
        await wait_until(pilot, lambda: any(n.startswith("⚙ tools: ") and "tools ready" in n
                                            for n in notices(app)), "the server's notice", 60)
        await wait_until(pilot, lambda: any("⚙ MCP server broken failed: " in n and "boom" in n
                                            for n in notices(app)), "the failure's notice", 60)
        assert not any("silent" in n for n in notices(app))  # still starting: nothing to tell


def test_each_state_has_its_notice():
    running = ServerStatus("docs", "stdio", "x", "running", (READ, RUN))
    assert status_notice(running) == ("⚙ docs: 2 tools ready", "information")
    failed = ServerStatus("db", "stdio", "x", "failed", error="exited: \x1b[31mno key")
    assert status_notice(failed) == ("⚙ MCP server db failed: exited: ^[[31mno key", "error")
    assert status_notice(ServerStatus("db", "stdio", "x", "stopped"))[1] == "warning"
    assert status_notice(ServerStatus("db", "stdio", "x", "starting")) is None


async def test_a_question_settled_elsewhere_or_left_with_its_session_goes_away(store):
    round_ = ToolRound([read("a.txt", "call00001"), read("b.txt", "call00002")],
                       policy=ApprovalPolicy())
    async with started(store, round_, "Read both.") as pilot:
        app = pilot.app
        screen = await asked(pilot)
        screen.request.answer(Decision.ONCE)  # the tool loop settled it (its stop denies, say)
        second = await asked(pilot, after=screen)
        assert second is not screen
        # The question holds the keys (Ctrl+N waits), but a session left by any way (here the
        # action itself) stops the turn and denies the question.
        await pilot.press("ctrl+n")
        assert app.screen is second
        await app.action_new_session()
        await wait_until(pilot, lambda: not isinstance(app.screen, ApprovalScreen), "the prompt to go")
        await wait_until(pilot, lambda: app.turns.current is None, "the turn to end")
        assert round_.log == [("call00001", "once"), ("call00001", "ran"), ("call00002", "deny")]


# --- through the chat layer's tool loop, stored, reopened --------------------------------------


def calling_engine(*replies: str) -> CallingEngine:
    """A model that answers with ``replies`` in turn (tests/calling_engine.py)."""
    def script(messages):
        since_user = next(i for i, m in enumerate(reversed(messages)) if m["role"] == "user")
        return replies[min(since_user // 2, len(replies) - 1)]

    return CallingEngine(reply=script)


async def test_a_call_through_the_tool_loop_is_approved_run_stored_and_shown_again_on_reopen(
        store, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("the secret word is tangerine\nsecond line")
    tools = ChatTools.open(Settings(tools=ToolsSettings(builtins=("read_file",))),
                           mcp_path=tmp_path / "none.json")  # ended by the app's services
    engine = calling_engine(call_text("read_file", path=str(notes)), "It says tangerine.")
    app = make_app(store, engine, services_factory=services_with(tools))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "What do my notes say?")
        screen = await asked(pilot)
        assert screen.request.tool.label == "builtin.read_file"
        assert str(notes) in await screen_text(pilot)
        await pilot.press("y")
        await reply_finished(pilot)
        [view] = views(app)
        assert view.state == "done" and "tangerine" in view.result.content
        assert view.line.startswith("⚙ builtin.read_file(")
        assert app.chat_log.last_reply().text == "It says tangerine."
    roles = [t.role for t in store.turns(store.last_session().id)]
    assert roles == ["user", "assistant", "tool", "assistant"]

    app = make_app(store, calling_engine("Again."), continue_last=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        reply = app.chat_log.last_reply()
        [view] = reply.query(ToolCallView)
        assert view.line == f'⚙ builtin.read_file({{"path": "{notes}"}})'
        assert view.state == "done" and view.collapsed and "✓ 2 lines" in str(view.title)
        assert reply.text == "It says tangerine."
        assert [type(w).__name__ for w in app.chat_log.messages()] == ["UserMessage", "ReplyView"]
        view.collapsed = False
        await pilot.pause()
        assert "the secret word is tangerine" in await screen_text(pilot)


async def test_a_stored_turn_stopped_in_its_calls_and_a_denied_call_show_as_they_were(store):
    session = store.create_session()
    store.add_user_turn(session.id, "Read both.")
    calls = (ToolCall("call00001", "read_file", {"path": "a.txt"}, raw="<tool_call>a</tool_call>"),
             ToolCall("call00002", "read_file", {"path": "b.txt"}, raw="<tool_call>b</tool_call>"))
    store.add_reply(session.id, "<think>which first</think>Reading.<tool_call>a</tool_call>"
                    "<tool_call>b</tool_call>", model="m", tool_calls=calls)
    store.add_tool_result(session.id, denied_result(calls[0], "files.read_file"),
                          label="files.read_file")
    store.add_user_turn(session.id, "Next.")
    store.add_reply(session.id, "Fine.", model="m")
    app = make_app(store, FakeEngine(), continue_last=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first = app.chat_log.messages()[1]
        assert isinstance(first, ReplyView)
        denied, unanswered = first.query(ToolCallView)
        assert denied.state == "denied" and denied.has_class("-error")
        assert unanswered.state == "stopped"
        assert [t.source for t in first.query(RoundText)] == ["Reading."]
        assert "<tool_call>" not in await screen_text(pilot)
        assert [type(w).__name__ for w in app.chat_log.messages()] == [
            "UserMessage", "ReplyView", "UserMessage", "ReplyView"]


async def test_tools_command_lists_the_tools_and_sets_the_sessions_tool_choice(store, tmp_path):
    tools = ChatTools.open(Settings(tools=ToolsSettings(builtins=("read_file", "list_directory"))),
                           mcp_path=tmp_path / "none.json")
    engine = FakeEngine(reply="Fine.")
    app = make_app(store, engine, services_factory=services_with(tools))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/tools")
        shown = await screen_text(pilot)
        assert "builtin · running" in shown and "read_file" in shown and "list_directory" in shown
        assert "tool choice auto" in shown
        await pilot.press("escape")

        await command(pilot, "/tools nosuch")
        assert any("there is no such tool" in n for n in notices(app))
        await command(pilot, "/tools read_file")
        assert app.conversation.tool_choice == "read_file"
        await command(pilot, "/tools REQUIRED")
        assert any("Tool choice required: the model must call a tool" in n for n in notices(app))
        await send(pilot, "Go.")
        await reply_finished(pilot)
        sampling = engine.samplings[-1]
        assert sampling.tool_choice == "required"
        assert {spec["function"]["name"] for spec in sampling.tools} == {"read_file", "list_directory"}


async def test_each_round_keeps_its_own_reasoning_and_ctrl_t_opens_them_all(store):
    round_ = ToolRound([read("notes.txt")], then="<think> The notes say hi. </think> They say hi.")
    app = make_app(store, FakeEngine(reply="<think> I should read the notes. </think> Reading.",
                                     tools=round_))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Notes?")
        await reply_finished(pilot)
        reply = app.chat_log.last_reply()
        blocks = reply.thinking_blocks()
        assert [b.text.strip() for b in blocks] == ["I should read the notes.", "The notes say hi."]
        assert all(b.collapsed for b in blocks)
        order = [type(w).__name__ for w in reply.children]
        assert order == ["ThinkingBlock", "RoundText", "ToolCallView", "ThinkingBlock", "LiveMarkdown",
                         "Static"]
        assert reply.text == "They say hi."
        await pilot.press("ctrl+t")
        assert not any(b.collapsed for b in blocks)


async def test_a_long_call_is_cut_in_its_line_so_how_it_went_stays_in_view(store):
    command_ = "find ~/projects -name '*.py' -newer ~/.cache/marker -exec grep -l TODO {} +"
    round_ = ToolRound([(ToolCall("call00001", "run_command", {"command": command_}), RUN)])
    app = app_with(store, round_)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "Find them.")
        await reply_finished(pilot)
        [view] = views(app)
        shown = await screen_showing(pilot, lambda text: "✓ 1 line" in text, "how the call went")
        assert "…)" in shown and command_ not in shown
        view.collapsed = False
        await pilot.pause()
        assert "-exec grep -l TODO" in await screen_text(pilot)  # the whole call, folded
