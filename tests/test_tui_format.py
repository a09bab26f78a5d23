"""``/format`` in the app: the shape asked of the next answers, shown in the status bar, sent to
the model with the turn, and its answers drawn as JSON blocks (a stored JSON reply too, when the
session reopens); an answer that is not of its shape is said so."""

from __future__ import annotations

import json

import pytest
from fake_engine import (
    SIZE,
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
from textual.widgets._markdown import MarkdownFence

from localchat.formats import read_schema
from localchat.tui.json_block import as_markdown, is_json_reply
from localchat.tui.status import render_status

pytestmark = pytest.mark.usefixtures("no_clipboard_tools")

ANSWER = '{"name": "Ada", "age": 36}'


def fences(app) -> list[MarkdownFence]:
    reply = app.chat_log.last_reply()
    return list(reply.body.query(MarkdownFence)) if reply is not None else []


async def test_format_with_a_schema_shapes_the_next_answers_and_the_status_bar_says_so(store):
    engine = FakeEngine(reply=ANSWER)
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/format name, age int")
        assert "schema {name, age}" in " ".join(notices(app))
        assert "│ schema {name, age}" in render_status(app.status.info, 120)[0]
        assert render_status(app.status.info, 60)[0].endswith("│ schema")  # narrow: the kind
        await wait_until(pilot, lambda: any("│ schema" in line for line in screen_lines(app)),
                         "the status bar")
        await send(pilot, "Who is Ada?")
        await reply_finished(pilot)
        shown = fences(app)
        assert len(shown) == 1 and shown[0].lexer == "json" and json.loads(shown[0].code) == json.loads(ANSWER)
        sampling = engine.samplings[-1]
        assert sampling.constraint is not None and "root ::=" in sampling.constraint.grammar
        assert sampling.response_format["json_schema"]["schema"] == read_schema("name, age int")
        await command(pilot, "/format off")
        assert "schema" not in render_status(app.status.info, 120)[0]
        await send(pilot, "And now?")
        await reply_finished(pilot)
        assert engine.samplings[-1].constraint is None and engine.samplings[-1].response_format is None
    assert store.turns(store.last_session().id)[1].content == ANSWER  # stored as it came


async def test_format_json_and_a_grammar_file(store, tmp_path):
    engine = FakeEngine(reply="yes")
    grammar = tmp_path / "yesno.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/format json")
        await send(pilot, "hi")
        await reply_finished(pilot)
        assert engine.samplings[-1].response_format == {"type": "json_object"}
        await command(pilot, f"/format {grammar}")
        await send(pilot, "Is it?")
        await reply_finished(pilot)
        assert engine.samplings[-1].constraint.grammar == 'root ::= "yes" | "no"\n'
        assert engine.samplings[-1].response_format is None  # no remote can take a grammar
        assert not fences(app)  # a grammar's answer is no JSON block
        await command(pilot, "/format")
        assert any("grammar yesno.gbnf" in n for n in notices(app))


async def test_bad_formats_are_one_line_notices_and_change_nothing(store, tmp_path):
    engine = FakeEngine(reply="ok")
    bad_grammar = tmp_path / "bad.gbnf"
    bad_grammar.write_text('root ::= ("a"')
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for argument, words in [('{"type": "object",', "not valid JSON"),
                                ('{"type": "object", "not": {}}', "keyword 'not'"),
                                ("name, age integer", "has the type 'integer'"),
                                (str(bad_grammar), "does not parse")]:
            await command(pilot, f"/format {argument}")
            assert any(words in n for n in notices(app)), (argument, notices(app))
        await send(pilot, "hi")
        await reply_finished(pilot)
    assert engine.samplings[-1].constraint is None


async def test_an_answer_not_of_its_shape_is_said_so(store):
    engine = FakeEngine(reply='{"name": "Ada"')
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/format name, age int")
        await send(pilot, "Who?")
        await reply_finished(pilot)
        await wait_until(pilot, lambda: any("not JSON" in n for n in notices(app)), "the notice")
        assert fences(app)  # still drawn as the JSON it was meant to be


async def test_a_stored_json_reply_reopens_as_a_json_block(store):
    app = make_app(store, FakeEngine(reply=ANSWER))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/format json")
        await send(pilot, "Who is Ada?")
        await reply_finished(pilot)
    reopened = make_app(store, FakeEngine(reply="ok"), continue_last=True)
    async with reopened.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: reopened.chat_log.last_reply() is not None, "the old reply")
        shown = fences(reopened)
        assert len(shown) == 1 and shown[0].lexer == "json"


async def test_format_completes_its_keywords(store):
    from localchat.tui.slash_commands import completions

    assert [c.text for c in completions("/format j")] == ["/format json"]
    assert [c.text for c in completions("/format ")] == ["/format json", "/format off"]


def test_json_replies_are_fenced_and_prose_is_not():
    assert as_markdown(ANSWER) == f"```json\n{ANSWER}\n```"
    assert as_markdown("[1, 2]").startswith("```json")
    assert as_markdown("Hello {there}") == "Hello {there}"
    assert as_markdown('{"a": 1', json_block=True).startswith("```json")  # a shaped turn's partial
    ticks = '{"code": "```py"}'
    assert as_markdown(ticks).startswith("````json") and is_json_reply(ticks)
    assert not is_json_reply('"just a string"') and not is_json_reply("")
    assert not is_json_reply("[" * 5000 + "]" * 5000)  # too deep to parse: shown as text
