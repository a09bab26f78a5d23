"""Tool calls in a model's reply: each family's form, read whole and streamed in pieces cut at
every point, leniently, with the marker and the raw JSON never shown as answer text."""

from __future__ import annotations

import random

import pytest

from localchat.reply import lenient_json
from localchat.reply.call_stream import ToolCallSplitter
from localchat.reply.calls import (
    ToolCall,
    assistant_message,
    calls_from_json,
    failed_call_result,
    new_call_id,
)
from localchat.reply.families import detect_format
from tests.tool_templates import LLAMA31, MISTRAL_NEMO, QWEN25, SMOLLM2

MARKERS = ("<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<function", '"name"')


def _pieces(out):
    """Answer text joined, calls as (name, arguments, problem, incomplete): ids are random."""
    shown = []
    for piece in out:
        if isinstance(piece, str):
            if shown and isinstance(shown[-1], str):
                shown[-1] += piece
            else:
                shown.append(piece)
        else:
            shown.append((piece.name, piece.arguments, bool(piece.problem), piece.incomplete))
    return shown


def _split(fmt, text, cuts=()):
    splitter = ToolCallSplitter(fmt)
    out, last = [], 0
    for cut in [*cuts, len(text)]:
        out += splitter.feed(text[last:cut])
        last = cut
    return out + splitter.flush()


def _same_at_every_split(fmt, text):
    whole = _pieces(_split(fmt, text))
    for cut in range(1, len(text)):
        assert _pieces(_split(fmt, text, [cut])) == whole, f"split at {cut}: {text[:cut]!r}"
    one_by_one = _pieces(_split(fmt, text, range(1, len(text))))
    assert one_by_one == whole, "fed one character at a time"
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        assert _pieces(_split(fmt, text, cuts)) == whole, f"cut at {cuts}"
    return whole


WEATHER = ("get_weather", {"city": "Paris"}, False, False)

SCRIPTS = [
    # Qwen 2.5 / Hermes: text, then a call in tags; two calls in a row; the call alone.
    ("hermes", 'Let me check the weather.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris"}}\n</tool_call>', ["Let me check the weather.", WEATHER]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
     [WEATHER, ("get_time", {}, False, False)]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
               'I asked for the weather.', [WEATHER, "I asked for the weather."]),
    # The variants llama.cpp accepts: a bare object, <function=NAME>, a code fence, <tools>.
    ("hermes", '{"name": "get_weather", "arguments": {"city": "Paris"}}', [WEATHER]),
    ("hermes", '<function=get_weather>{"city": "Paris"}</function>', [WEATHER]),
    ("hermes", '<function name="get_weather">{"city": "Paris"}</function>', [WEATHER]),
    ("hermes", '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', [WEATHER]),
    ("hermes", '<tools>{"name": "get_weather", "arguments": {"city": "Paris"}}</tools>', [WEATHER]),
    # Llama 3.x: the reply is the call object, "parameters" for arguments; two joined by ";";
    # a builtin after <|python_tag|>.
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', [WEATHER]),
    ("llama3", '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_time", "parameters": {}}', [WEATHER, ("get_time", {}, False, False)]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', [WEATHER]),
    ("llama3", '<|python_tag|>brave_search.call(query="weather in Paris", count=3)',
     [("brave_search", {"query": "weather in Paris", "count": 3}, False, False)]),
    # Mistral: the array after [TOOL_CALLS] (arguments sometimes a JSON string), and the
    # newer name[ARGS] form.
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                '"id": "abc123XYZ"}]', [WEATHER]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}, '
                '{"name": "get_time", "arguments": {}}]', [WEATHER, ("get_time", {}, False, False)]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', [WEATHER]),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Paris"}',
     ["Sure.", WEATHER]),
    # Generic: our own prompt's hermes form, and llama.cpp's envelope at the start.
    ("generic", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     [WEATHER]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', [WEATHER]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
     [WEATHER]),
]


@pytest.mark.parametrize("fmt, text, expected", SCRIPTS)
def test_each_familys_calls_are_read_whole_and_at_every_split_point(fmt, text, expected):
    assert _same_at_every_split(fmt, text) == expected


@pytest.mark.parametrize("fmt, text, expected", SCRIPTS)
def test_no_marker_or_raw_json_is_ever_released_as_answer_text(fmt, text, expected):
    for cuts in ([], range(1, len(text))):
        for piece in _split(fmt, text, cuts):
            if isinstance(piece, str):
                assert not any(marker in piece for marker in MARKERS), piece


def test_small_models_json_is_read_leniently():
    text = ("<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Paris', 'note': 'it's "
            "sunny', 'metric': True,},}</tool_call>")
    [call] = _same_at_every_split("hermes", text)
    assert call == ("get_weather", {"city": "Paris", "note": "it's sunny", "metric": True}, False,
                    False)


def test_a_call_whose_tag_closes_before_its_last_brace_is_healed():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>'
    assert _same_at_every_split("hermes", text) == [WEATHER]


def test_a_closing_tag_inside_a_string_argument_does_not_end_the_call():
    text = '<tool_call>{"name": "note", "arguments": {"text": "write </tool_call> here"}}</tool_call>'
    assert _same_at_every_split("hermes", text) == [("note", {"text": "write </tool_call> here"},
                                                     False, False)]


@pytest.mark.parametrize("fmt, text", [
    ("hermes", '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "text": "Once up'),
    ("llama3", '{"name": "write_file", "parameters": {"path": "a.txt", "te'),
    ("mistral", '[TOOL_CALLS][{"name": "write_file", "arguments": {"path": "a.'),
    ("hermes", "<tool_call>\n"),
])
def test_a_call_cut_by_max_tokens_is_reported_incomplete_and_cannot_run(fmt, text):
    [call] = _split(fmt, text)
    assert isinstance(call, ToolCall)
    assert call.incomplete and not call.runnable
    assert "cut off" in call.problem
    assert _pieces(_split(fmt, text, range(1, len(text)))) == _pieces([call])


def test_a_reply_cut_inside_the_closing_tag_shows_none_of_it():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_'
    [call] = _split("hermes", text)
    assert isinstance(call, ToolCall) and call.runnable and call.raw == text
    assert _pieces(_split("hermes", text, range(1, len(text)))) == _pieces([call])


@pytest.mark.parametrize("fmt, text", [
    ("hermes", "A plain answer with <b>tags</b>, [links](x) and {braces}, ending in spaces.   "),
    ("hermes", '{"answer": 42, "why": "a JSON answer is not a call"}'),
    ("llama3", 'The call format is {"name": "x", "parameters": {}} (an example, mid-answer).'),
    ("mistral", "Arrays like [1, 2] and [TOOL] are text."),
    ("generic", "Use a <tool> or a <toolbox>; < and [ alone are fine."),
])
def test_answers_that_are_not_calls_come_out_unchanged(fmt, text):
    assert _same_at_every_split(fmt, text) == [text.rstrip()]


def test_plain_answer_text_streams_through_without_being_held_back():
    splitter = ToolCallSplitter("hermes")
    assert splitter.feed("Hello") == ["Hello"]
    assert splitter.feed(" world, how") == [" world, how"]
    assert splitter.feed(" are you <tool") == [" are you"]  # may become <tool_call>
    assert splitter.feed("box>?") == [" <toolbox>?"]


def test_a_call_that_is_not_json_gets_a_problem_the_model_can_read():
    [call] = _same_at_every_split("hermes", "<tool_call>get_weather Paris</tool_call>")
    assert call[2] is True and call[0] == ""
    [bad] = _split("hermes", "<tool_call>get_weather Paris</tool_call>")
    result = failed_call_result(bad)
    assert result.is_error and "not a JSON object" in result.content


def test_the_splitter_says_when_a_call_has_begun():
    splitter = ToolCallSplitter("hermes")
    splitter.feed("<tool_call>\n{")
    assert splitter.in_call
    [call] = splitter.feed('"name": "get_time", "arguments": {}}</tool_call>')
    assert not splitter.in_call and splitter.calls == [call]


@pytest.mark.parametrize("template, family", [
    (QWEN25, "hermes"), (LLAMA31, "llama3"), (MISTRAL_NEMO, "mistral"), (SMOLLM2, "generic"),
])
def test_the_family_is_read_from_the_chat_template(template, family):
    assert detect_format(template).name == family


def test_calls_keep_a_valid_id_and_get_one_otherwise():
    [kept] = calls_from_json('{"name": "a", "arguments": {}, "id": "abc123XYZ"}')
    [fresh] = calls_from_json('{"name": "a", "arguments": {}, "id": "call_1"}')
    assert kept.id == "abc123XYZ"
    assert len(fresh.id) == 9 and fresh.id.isalnum() and len(new_call_id()) == 9


def test_a_call_round_trips_through_openai_shape():
    call = ToolCall("abc123XYZ", "get_weather", {"city": "Paris"})
    assert ToolCall.from_openai(call.to_openai()) == call
    message = assistant_message("", [call])
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


@pytest.mark.parametrize("text, value, complete", [
    ('{"a": 1,}', {"a": 1}, True),
    ("{'a': 'it's', 'b': 'say \"hi\"'}", {"a": "it's", "b": 'say "hi"'}, True),
    ('{"a": True, "b": None, "c": False}', {"a": True, "b": None, "c": False}, True),
    ('[{"a": [1, 2,],},]', [{"a": [1, 2]}], True),
    ('{"a": "line\nbreak"}', {"a": "line\nbreak"}, True),
    ('{"a": [1, 2', {"a": [1, 2]}, False),
    ('{"a": "unfinished', {"a": "unfinished"}, False),
    ('{"a": 1, "b"', {"a": 1, "b": None}, False),
    ('{"a":', {"a": None}, False),
])
def test_lenient_json(text, value, complete):
    assert lenient_json.parse(text) == (value, complete)


def test_lenient_json_refuses_what_cannot_be_read():
    with pytest.raises(ValueError):
        lenient_json.parse('{"a" 1}')


def test_with_the_tools_known_a_json_answer_about_a_name_stays_an_answer():
    answer = '{"name": "Alice", "age": 31}'
    names = ("get_weather", "get_time")
    for fmt in ("hermes", "generic"):
        splitter = ToolCallSplitter(fmt, tool_names=names)
        assert _pieces(splitter.feed(answer) + splitter.flush()) == [answer]
        splitter = ToolCallSplitter(fmt, tool_names=names)
        call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
        out = [p for ch in call for p in splitter.feed(ch)] + splitter.flush()
        assert _pieces(out) == [WEATHER]


def test_the_start_trigger_matches_what_the_splitter_reads_as_a_bare_call():
    import re

    from localchat.reply.families import FORMATS, start_trigger

    hermes = re.compile(start_trigger(FORMATS["hermes"], ("get_weather",)))
    assert hermes.fullmatch('\n{"name": "get_weather", "arguments": {}}')
    assert not hermes.fullmatch('{"name": "Alice", "age": 31}')
    llama = re.compile(start_trigger(FORMATS["llama3"], ("get_weather",)))
    assert llama.fullmatch('{"type": "function", "name": "made_up", "parameters": {}}')
    assert start_trigger(FORMATS["mistral"], ("get_weather",)) is None


@pytest.mark.parametrize("fmt, text", [
    ("hermes", "<tool_call>" + "[" * 5000),  # deeper than json itself will read
    ("hermes", "<function=" + "a" * 5000 + ">{}</function>"),  # no tool has such a name
    ("mistral", "[TOOL_CALLS]" + "b" * 5000 + "[ARGS]{}"),
])
def test_hostile_replies_end_as_text_or_a_call_with_a_problem_never_an_exception(fmt, text):
    for step in (1, 7, len(text)):
        out = _split(fmt, text, range(step, len(text), step))
        assert all(isinstance(p, str) or not p.runnable for p in out)


def test_a_long_builtin_call_streamed_in_small_pieces_is_read_once():
    text = '<|python_tag|>search.call(query="' + "x" * 20_000 + '", count=2)'
    [call] = _split("llama3", text, range(4, len(text), 4))
    assert call.name == "search" and call.arguments == {"query": "x" * 20_000, "count": 2}
