"""Answer formats without a model: JSON Schema to GBNF, the check of finished answers, llm's short
form, and what ``--schema`` reads. Grammars are judged by llama.cpp's own grammar engine over the
test model's vocabulary (loaded alone, no weights: tests/grammar_probe.py)."""

from __future__ import annotations

import json
import random

import pytest
from grammar_probe import GrammarProbe
from schema_samples import random_instance, random_schema, written

from localchat.errors import FormatError
from localchat.formats import (
    describe,
    grammar_format,
    json_format,
    read_schema,
    schema_format,
)
from localchat.formats.json_schema import schema_grammar
from localchat.formats.ranges import integer_range
from localchat.formats.short_form import short_form_schema
from localchat.formats.validate import json_equal, schema_problem


@pytest.fixture(scope="module")
def probe(test_model_path):
    p = GrammarProbe(test_model_path)
    yield p
    p.close()


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "nick": {"type": ["string", "null"]},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_generated_schemas_turn_into_grammars_that_accept_their_valid_answers(probe):
    """(How fast they convert is ``bench --schema``'s to measure: the budget is 50 ms.)"""
    rng = random.Random(39)
    for _ in range(150):
        schema = random_schema(rng)
        answer_format = schema_format(schema)
        for _ in range(4):
            text = written(rng, random_instance(rng, schema, schema))
            assert schema_problem(json.loads(text), schema) is None, (schema, text)
            assert probe.accepts(answer_format.grammar, text), (schema, text, answer_format.grammar)


@pytest.mark.parametrize("text", [
    '{"name": "Ada", "age": 36}',
    '{"name":"Ada","age":36,"email":"ada@example.org","tags":["x","y"],"nick":null}',
    '{\n  "name": "Ada",\n  "age": 0,\n  "nick": "A"\n}',
])
def test_a_schema_grammar_accepts_answers_of_its_shape(probe, text):
    assert probe.accepts(schema_format(PERSON).grammar, text)


@pytest.mark.parametrize("text, why", [
    ('{"age": 36}', "a required property missing"),
    ('{"name": "Ada", "age": 121}', "an integer above the maximum"),
    ('{"name": "Ada", "age": -1}', "an integer below the minimum"),
    ('{"name": "Ada", "age": 36.5}', "a number where an integer goes"),
    ('{"name": "Ada", "age": 36, "x": 1}', "a property additionalProperties forbids"),
    ('{"name": "Ada", "age": 36, "tags": ["a", "b", "c"]}', "more items than maxItems"),
    ('{"name": "", "age": 36}', "a string under minLength"),
    ('{"age": 36, "name": "Ada"}', "properties out of the schema's order"),
    ('{"name": "Ada", "age": 36} ', "text after the value"),
    ('```json\n{"name": "Ada", "age": 36}\n```', "a Markdown fence"),
    ('{"name": "Ada", "age": 036}', "a leading zero"),
])
def test_a_schema_grammar_refuses_answers_of_another_shape(probe, text, why):
    assert not probe.accepts(schema_format(PERSON).grammar, text), why


def test_any_json_object_is_what_format_json_allows(probe):
    grammar = json_format().grammar
    assert probe.accepts(grammar, '{"a": [1, 2.5e-3, true, null, {"b": "c\\n\\u00e9"}], "d": {}}')
    assert probe.accepts(grammar, "{}")
    for text in ("[1, 2]", '"text"', "42", '{"a": }', "{'a': 1}"):
        assert not probe.accepts(grammar, text), text


@pytest.mark.parametrize("low, high", [(0, 120), (15, 213), (-40, 40), (-1000, -7), (7, 7),
                                       (None, 12), (-5, None), (100, None), (None, -100)])
def test_integer_ranges_hold_exactly_their_numbers(probe, low, high):
    grammar = f"root ::= {integer_range(low, high)}\n"
    start = (low if low is not None else (high or 0) - 300) - 30
    end = (high if high is not None else (low or 0) + 300) + 30
    for n in range(start, end + 1):
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert probe.accepts(grammar, str(n)) == inside, n
    assert not probe.accepts(grammar, "-0") and not probe.accepts(grammar, "007")


def test_properties_may_be_left_out_in_any_combination_but_keep_their_order(probe):
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"},
              "required": ["c"]}
    grammar = schema_format(schema).grammar
    for text in ('{"c": 1}', '{"a": 1, "c": 2}', '{"b": 1, "c": 2, "d": 3}',
                 '{"a": 1, "b": 2, "c": 3, "d": 4}'):
        assert probe.accepts(grammar, text), text
    for text in ("{}", '{"a": 1}', '{"d": 1, "c": 2}', '{"a": 1,, "c": 2}', '{, "c": 2}'):
        assert not probe.accepts(grammar, text), text


def test_additional_properties_follow_the_declared_ones_when_allowed(probe):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "additionalProperties": {"type": "boolean"}}
    grammar = schema_format(schema).grammar
    assert probe.accepts(grammar, '{"a": 1, "x": true, "y": false}')
    assert probe.accepts(grammar, '{"x": true}')
    assert not probe.accepts(grammar, '{"a": 1, "x": 2}')


def test_recursive_references_and_tuples_and_formats(probe):
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"]}}, "$ref": "#/$defs/node"}
    assert probe.accepts(schema_grammar(tree), '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}')
    pair = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}
    assert probe.accepts(schema_grammar(pair), '[1, "a"]')
    assert not probe.accepts(schema_grammar(pair), '[1, "a", 2]')
    when = {"type": "object", "properties": {"d": {"type": "string", "format": "date-time"}},
            "required": ["d"]}
    assert probe.accepts(schema_grammar(when), '{"d": "2026-03-01T12:30:00Z"}')
    assert not probe.accepts(schema_grammar(when), '{"d": "yesterday"}')


def test_enums_and_constants_are_written_as_their_values(probe):
    schema = {"type": "object", "properties": {
        "color": {"enum": ["red", "green", None]}, "v": {"const": {"k": [1, 2]}}},
        "required": ["color", "v"]}
    grammar = schema_grammar(schema)
    assert probe.accepts(grammar, '{"color": "green", "v": {"k":[1,2]}}')
    assert probe.accepts(grammar, '{"color": null, "v": {"k":[1,2]}}')
    assert not probe.accepts(grammar, '{"color": "blue", "v": {"k":[1,2]}}')


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "not": {"type": "null"}}, "keyword 'not'"),
    ({"type": "object", "patternProperties": {}}, "keyword 'patternProperties'"),
    ({"type": "object", "properties": {"a": {"if": {}, "then": {}}}}, "/properties/a uses the keyword 'if'"),
    ({"type": "strnig"}, "'strnig' is not a JSON Schema type"),
    ({"type": []}, "non-empty list"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "'minLength' 5 is above 'maxLength' 2"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "'minItems' 3 is above 'maxItems' 1"),
    ({"type": "integer", "minimum": 10, "maximum": 3}, "allows no integer"),
    ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "allows no integer"),
    ({"type": "number", "minimum": 10, "maximum": 3}, "allows no number"),
    ({"type": "string", "const": 3}, "'const' holds no value of its 'type'"),
    ({"type": "integer", "enum": ["a", "b"]}, "'enum' holds no value"),
    ({"enum": []}, "non-empty list"),
    ({"anyOf": []}, "non-empty list"),
    ({"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False},
     "requires 'x', which 'additionalProperties': false forbids"),
    ({"$ref": "#/$defs/missing"}, "points to nothing"),
    ({"$ref": "https://example.org/s.json"}, "points outside the schema"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"},
     "refers to itself"),
    ({"type": "string", "format": "colour"}, "'format' 'colour' is not supported"),
    ({"type": "string", "pattern": "(unclosed"}, "is not a regular expression"),
    ({"type": "number", "multipleOf": 0}, "'multipleOf' must be a number above 0"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "'allOf' with more than one"),
    ({"type": "object", "anyOf": [{"required": ["a"]}]}, "beside 'anyOf'"),
    ({"type": "array", "items": False, "minItems": 1}, "asks for more items"),
    (False, "must be a JSON object"),
    ([], "must be a JSON object"),
])
def test_schemas_that_cannot_be_enforced_or_contradict_themselves_are_refused(schema, words):
    with pytest.raises(FormatError) as info:
        schema_format(schema)
    message = str(info.value)
    assert words in message and "\n" not in message, message


def test_annotations_and_definitions_beside_references_are_fine(probe):
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "T",
              "$defs": {"n": {"type": "integer", "description": "a number"}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/n", "description": "x"},
                                               "b": {"allOf": [{"$ref": "#/$defs/n"}]}},
              "required": ["a", "b"]}
    assert probe.accepts(schema_grammar(schema), '{"a": 1, "b": 2}')


def test_keywords_only_checked_afterwards_make_an_answer_invalid():
    schema = {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "price": {"type": "number", "minimum": 0.5, "maximum": 10, "multipleOf": 0.25},
        "ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "email": {"type": "string", "format": "email"},
        "day": {"type": "string", "format": "date"}}}
    schema_format(schema)  # accepted
    assert schema_problem({"code": "ABC", "price": 2.5, "ids": [1, 2]}, schema) is None
    for value, words in [({"code": "abc"}, "does not match the pattern"),
                         ({"price": 0.25}, "less than the minimum 0.5"),
                         ({"price": 2.3}, "not a multiple of 0.25"),
                         ({"ids": [1, 1]}, "appears twice"),
                         ({"email": "nobody"}, "not a valid email"),
                         ({"day": "2026-02-30"}, "not a valid date")]:
        problem = schema_problem(value, schema)
        assert problem is not None and words in problem, (value, problem)


def test_one_of_is_checked_for_exactly_one_match():
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert "matches 2 of the 'oneOf' schemas" in schema_problem(3, schema)
    assert schema_problem(3.5, schema) is None


def test_json_equality_tells_booleans_from_numbers():
    assert json_equal(1, 1.0) and not json_equal(True, 1) and not json_equal(0, False)
    assert schema_problem(True, {"enum": [1]}) is not None
    assert schema_problem(1, {"const": 1.0}) is None


def test_answer_format_problems_name_what_is_wrong():
    person = schema_format(PERSON)
    assert person.problem('{"name": "Ada", "age": 36}') is None
    assert "not JSON" in person.problem('{"name": "Ada", "age"')
    assert "at /age: 200 is greater than the maximum 120" in person.problem('{"name": "A", "age": 200}')
    assert json_format().problem("[1]") == "the answer is not a JSON object"
    assert grammar_format('root ::= "a"', "a.gbnf").problem("anything") is None


def test_the_remote_is_asked_for_the_same_shape():
    assert json_format().response_format() == {"type": "json_object"}
    asked = schema_format(PERSON).response_format()
    assert asked["type"] == "json_schema" and asked["json_schema"]["schema"] == PERSON


def test_short_form_is_llms():
    assert short_form_schema("name, age int, bio: one line") == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "bio": {"type": "string", "description": "one line"}},
        "required": ["name", "age", "bio"]}
    newline = short_form_schema("name str: the full name, as on the card\nscore float\nok bool")
    assert newline["properties"]["name"]["description"] == "the full name, as on the card"
    assert newline["properties"]["score"] == {"type": "number"}
    multi = short_form_schema("name", multi=True)
    assert multi["properties"]["items"]["items"]["required"] == ["name"]


@pytest.mark.parametrize("text, words", [
    ("", "the schema is empty"), (" , ,", "the schema is empty"),
    ("name, age integer", "'age' has the type 'integer'"),
    ("name, name int", "names the field 'name' twice"),
    (": nothing", "has no name"),
    ("first last int", "more than a name and a type"),
])
def test_bad_short_forms_are_refused(text, words):
    with pytest.raises(FormatError) as info:
        short_form_schema(text)
    assert words in str(info.value)


def test_schema_text_file_or_short_form(tmp_path, monkeypatch):
    assert read_schema('{"type": "object"}') == {"type": "object"}
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    assert read_schema(str(path)) == PERSON
    assert read_schema(str(path), multi=True)["properties"]["items"]["items"] == PERSON
    assert read_schema("name, age int")["required"] == ["name", "age"]
    monkeypatch.chdir(tmp_path)
    assert read_schema("person.json") == PERSON
    for text, words in [('{"type": "object",}', "the schema is not valid JSON"),
                        ("missing.json", "does not exist"), ("./dir/x", "does not exist")]:
        with pytest.raises(FormatError) as info:
            read_schema(text)
        assert words in str(info.value)
    (tmp_path / "broken.json").write_text("{nope")
    with pytest.raises(FormatError, match="broken.json is not valid JSON"):
        read_schema(str(tmp_path / "broken.json"))


def test_a_schema_is_described_in_a_few_words():
    assert describe(PERSON) == "{name, age, email, tags[], …}"
    assert schema_format(short_form_schema("a, b int", multi=True)).name == "schema {items[]}"


def test_every_bad_input_is_a_format_error_with_exit_status_2():
    with pytest.raises(FormatError) as info:
        schema_format({"type": "nope"})
    assert info.value.exit_code == 2
    with pytest.raises(FormatError):
        grammar_format("  \n", "empty.gbnf")


def test_hostile_sizes_never_unroll_into_huge_grammars_or_crash(probe):
    for schema in ({"type": "string", "minLength": 10**9},
                   {"type": "array", "minItems": 10**9, "items": {"type": "integer"}},
                   {"type": "array", "maxItems": 10**9},
                   {"type": "integer", "minimum": -10**40, "maximum": 10**40},
                   {"type": "integer", "minimum": 5, "maximum": 10**40}):
        grammar = schema_format(schema).grammar
        assert len(grammar) < 5000, schema
    assert probe.accepts(schema_grammar({"type": "string", "minLength": 150}), json.dumps("x" * 100))
    assert not probe.accepts(schema_grammar({"type": "string", "minLength": 150}), json.dumps("x" * 99))
    assert "shorter than 150" in schema_problem("x" * 100, {"type": "string", "minLength": 150})
    deep = "{" + '"a": {' * 5000 + "}" * 5001
    with pytest.raises(FormatError, match="nests too deeply"):
        read_schema(deep)
    nested: dict = {}
    for _ in range(3000):
        nested = {"type": "object", "properties": {"a": nested}}
    with pytest.raises(FormatError, match="nests too deeply"):
        schema_format(nested)
    assert json_format().problem("[" * 5000 + "]" * 5000) is not None  # no crash


def test_names_and_values_with_quotes_controls_and_any_script_are_written_escaped(probe):
    name = 'say "hi"\\ \n ü 中 🙂'
    schema = {"type": "object", "properties": {name: {"enum": ["tab\there", "\u0001", "é"]}},
              "required": [name]}
    grammar = schema_grammar(schema)
    for value in ("tab\there", "\u0001", "é"):
        text = json.dumps({name: value}, ensure_ascii=False)
        assert probe.accepts(grammar, text), text
        assert schema_problem(json.loads(text), schema) is None
    assert not probe.accepts(grammar, json.dumps({name: "other"}, ensure_ascii=False))
