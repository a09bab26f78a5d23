"""May this call run? once, always this session (run_command: only the same command), always
saved in config.toml, or deny; --allow-tool rules; the question as an object with a Future."""

from __future__ import annotations

import threading

import pytest

from localchat import paths
from localchat.errors import UserError
from localchat.reply.calls import ToolCall
from localchat.settings import load_config
from localchat.settings.tools import ToolsSettings
from localchat.tools.approval import AllowRules, ApprovalPolicy, Decision, call_line
from localchat.tools.catalogue import ToolInfo
from localchat.tools.registry import ToolRegistry
from localchat.tools.results import denied_result

SEARCH = ToolInfo("web", "search", exposed="search")
FETCH = ToolInfo("web", "fetch", exposed="fetch")
SHELL = ToolInfo("builtin", "run_command", exposed="run_command")


def call(arguments=None, name="search"):
    return ToolCall("abc123XYZ", name, {"query": "weather"} if arguments is None else arguments)


def test_a_call_nobody_allowed_yet_becomes_a_question_with_a_future():
    request = ApprovalPolicy().check(call(), SEARCH)
    assert request is not None and not request.future.done()
    assert request.line == 'web.search({"query": "weather"})' and request.can_save
    assert request.answer(Decision.ONCE) == "" and request.wait(0) is Decision.ONCE


def test_once_allows_only_that_call():
    policy = ApprovalPolicy()
    policy.check(call(), SEARCH).answer(Decision.ONCE)
    assert policy.check(call(), SEARCH) is not None


def test_always_this_session_covers_the_tool_not_its_neighbours():
    policy = ApprovalPolicy()
    notice = policy.check(call(), SEARCH).answer(Decision.SESSION)
    assert notice == "web.search: allowed until localchat exits"
    assert policy.check(call({"query": "anything else"}), SEARCH) is None
    assert policy.check(call(name="fetch"), FETCH) is not None


def test_always_for_run_command_covers_only_the_same_command_string():
    policy = ApprovalPolicy()
    request = policy.check(call({"command": "ls -la"}, "run_command"), SHELL)
    assert request.per_command and not request.can_save
    assert "this exact command" in request.answer(Decision.SESSION)
    assert policy.check(call({"command": "ls -la"}, "run_command"), SHELL) is None
    assert policy.check(call({"command": "rm -rf ~"}, "run_command"), SHELL) is not None
    # Saving is not offered for it; an answer to save anyway stays per command, unsaved.
    policy.check(call({"command": "pwd"}, "run_command"), SHELL).answer(Decision.SAVE)
    assert not paths.config_file().exists()


def test_a_denial_never_runs_and_the_model_reads_denied_by_the_user():
    policy = ApprovalPolicy()
    request = policy.check(call(), SEARCH)
    assert request.answer(Decision.DENY) == "" and not request.wait().allows
    result = denied_result(request.call, request.tool.label)
    assert (result.content, result.is_error, result.notice) == ("denied by the user", True,
                                                               "web.search: denied")
    assert policy.check(call(), SEARCH) is not None


def test_always_saved_goes_to_config_toml_and_holds_in_the_next_session():
    paths.config_file().write_text("# mine\n[sampling]\ntemperature = 0.3  # low\n")
    notice = ApprovalPolicy().check(call(), SEARCH).answer(Decision.SAVE)
    assert notice == f"web.search: always allowed (saved in {paths.config_file()})"
    assert "temperature = 0.3  # low" in paths.config_file().read_text()
    next_session = ApprovalPolicy(load_config().tools)
    assert next_session.check(call(), SEARCH) is None
    assert next_session.check(call(name="fetch"), FETCH) is not None


def test_a_save_that_fails_still_allows_for_the_session_and_says_why():
    paths.config_file().write_text("[broken\n")
    policy = ApprovalPolicy()
    notice = policy.check(call(), SEARCH).answer(Decision.SAVE)
    assert "allowed until localchat exits; saving failed" in notice and "invalid TOML" in notice
    assert policy.check(call(), SEARCH) is None


def test_saved_always_allow_with_a_star_covers_every_tool_of_that_server():
    policy = ApprovalPolicy(ToolsSettings(always_allow={"web": ("*",)}))
    assert policy.check(call(), SEARCH) is None and policy.check(call(), FETCH) is None
    assert policy.check(call({"command": "ls"}, "run_command"), SHELL) is not None


@pytest.mark.parametrize("rules, allowed", [
    (["*"], {"search", "fetch", "run_command"}),
    (["search"], {"search"}),
    (["web.*"], {"search", "fetch"}),
    (["builtin.run_command", "web.fetch"], {"run_command", "fetch"}),
    (["other.search"], set()),
])
def test_allow_tool_rules(rules, allowed):
    policy = ApprovalPolicy(rules=AllowRules(rules))
    shown = {tool.name for tool in (SEARCH, FETCH, SHELL)
             if policy.check(call({"command": "ls"}, tool.name), tool) is None}
    assert shown == allowed


def test_an_empty_allow_tool_rule_is_a_user_error():
    with pytest.raises(UserError, match="--allow-tool needs a tool name"):
        AllowRules([" "])


def test_the_question_can_be_answered_from_another_thread_and_only_once():
    request = ApprovalPolicy().check(call(), SEARCH)
    threading.Timer(0.05, request.answer, args=(Decision.SESSION,)).start()
    assert request.wait(5) is Decision.SESSION
    assert request.answer(Decision.DENY) == "" and request.wait() is Decision.SESSION


def test_a_calls_line_is_inert_and_short():
    line = call_line(ToolCall("abc123XYZ", "echo", {"text": "\x1b]0;title\x07" + "x" * 500}),
                     ToolInfo("s", "echo"))
    assert "\x1b" not in line and len(line) <= 200 and line.startswith("s.echo(")


def test_the_policy_works_with_the_registrys_tools():
    with ToolRegistry(settings=ToolsSettings(builtins=("list_directory",))) as registry:
        tool = registry.find("list_directory")
        policy = ApprovalPolicy(rules=AllowRules(["builtin.list_directory"]))
        assert policy.check(call({}, "list_directory"), tool) is None
        assert not registry.call(call({}, "list_directory")).is_error
