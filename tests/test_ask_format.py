"""``ask --format/--schema/--schema-multi/--grammar``: stdout carries exactly the answer, exit 0
only when it is complete and of its shape; incomplete answers on stderr with exit 1; bad input
exits 2 with one line before any model loads."""

from __future__ import annotations

import json

import pytest

from localchat.cli import main
from localchat.formats import read_schema
from localchat.formats.validate import schema_problem


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ask(capsys, model, *args):
    return run_cli(capsys, "ask", "--model", str(model), "--temperature", "0", *args)


def test_a_schema_answer_is_exactly_the_json_on_stdout(test_model_path, capsys):
    code, out, err = ask(capsys, test_model_path, "--schema", "name, age int, city",
                         "Describe a person.")
    assert code == 0, err
    value = json.loads(out)
    assert schema_problem(value, read_schema("name, age int, city")) is None
    assert out == out.strip() + "\n" and "TTFT" in err


def test_schema_multi_is_a_list_under_items_and_format_json_any_object(test_model_path, capsys,
                                                                      tmp_path):
    code, out, err = ask(capsys, test_model_path, "--schema-multi", "name, score float",
                         "--max-tokens", "200", "Ann scored 3 and Bob scored 5. List both players.")
    assert code == 0, err
    assert isinstance(json.loads(out)["items"], list)
    schema = tmp_path / "answer.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                  "required": ["ok"], "additionalProperties": False}))
    code, out, err = ask(capsys, test_model_path, "--schema", str(schema), "Is water wet?")
    assert code == 0 and json.loads(out).keys() == {"ok"}, err
    code, out, err = ask(capsys, test_model_path, "--format", "json", "--max-tokens", "200",
                         "Describe a cat as JSON.")
    assert code == 0 and isinstance(json.loads(out), dict), err


def test_a_grammar_answer_is_one_the_grammar_allows(test_model_path, capsys, tmp_path):
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= ("yes" | "no") "." ws reason\nws ::= " "\n'
                       'reason ::= [A-Za-z ,]{1,60} "."\n')
    code, out, err = ask(capsys, test_model_path, "--grammar", str(grammar), "Is the sky blue?")
    assert code == 0, err
    assert out.split(".")[0] in ("yes", "no") and out.endswith(".\n")


def test_an_answer_cut_by_the_token_limit_is_incomplete_on_stderr(test_model_path, capsys):
    code, out, err = ask(capsys, test_model_path, "--schema", "name, age int, city",
                         "--max-tokens", "6", "Describe a person.")
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert "answer is incomplete" in lines[0] and "token limit" in lines[0]
    assert lines[1].startswith("{")  # the partial text, never as the answer


def test_json_events_carry_the_answer_as_tokens_and_say_whether_it_is_complete(test_model_path,
                                                                             capsys):
    code, out, _ = ask(capsys, test_model_path, "--json", "--schema", "name, age int",
                       "Describe a person.")
    events = [json.loads(line) for line in out.splitlines()]
    text = "".join(e["text"] for e in events if e["event"] == "token")
    done = events[-1]
    assert code == 0 and json.loads(text).keys() == {"name", "age"}
    assert done["format"] == {"name": "schema {name, age}", "complete": True, "problem": None}
    assert done["timings"]["constrained_n"] > 0
    code, out, _ = ask(capsys, test_model_path, "--json", "--schema", "name, age int",
                       "--max-tokens", "4", "Describe a person.")
    done = json.loads(out.splitlines()[-1])
    assert code == 1 and done["format"]["complete"] is False
    assert "incomplete" in done["format"]["problem"]


@pytest.mark.parametrize("flags, words", [
    (["--schema", '{"type": "object",'], "the schema is not valid JSON"),
    (["--schema", '{"type": "object", "not": {}}'], "keyword 'not'"),
    (["--schema", '{"type": "string", "minLength": 3, "maxLength": 1}'], "'minLength' 3 is above"),
    (["--schema", ""], "the schema is empty"),
    (["--schema", " , "], "the schema is empty"),
    (["--schema-multi", "name, age integer"], "has the type 'integer'"),
    (["--schema", "missing-file.json"], "does not exist"),
    (["--format", "yaml"], "--format takes 'json' or a JSON Schema"),
    (["--format", '{"type": "object", "if": {}}'], "keyword 'if'"),
])
def test_bad_shapes_exit_2_with_one_line_before_any_model_loads(capsys, flags, words):
    code, out, err = run_cli(capsys, "ask", "--model", "no-such-model", *flags, "hi")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err and "unknown model" not in err


@pytest.mark.parametrize("text, words", [
    ('root ::= ("a"', "does not parse: expecting ')'"),
    ("root ::= rule-nowhere", "Undefined rule identifier 'rule-nowhere'"),
    ('answer ::= "a"', "no start rule 'root'"),
    ('root ::= root "a" | "b"', "left recursion"),
    ("", "is empty"),
])
def test_a_grammar_that_does_not_parse_exits_2_before_any_model_loads(capsys, tmp_path, text,
                                                                      words):
    grammar = tmp_path / "g.gbnf"
    grammar.write_text(text)
    code, out, err = run_cli(capsys, "ask", "--model", "no-such-model", "--grammar", str(grammar),
                             "hi")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err
    code, _, err = run_cli(capsys, "ask", "--model", "no-such-model", "--grammar",
                           str(tmp_path / "none.gbnf"), "hi")
    assert code == 2 and "cannot read the grammar" in err


def test_a_grammar_naming_a_token_the_model_lacks_exits_2_after_the_load(test_model_path, capsys,
                                                                        tmp_path):
    grammar = tmp_path / "tokens.gbnf"
    grammar.write_text('root ::= "a" <|no-such-token|>\n')
    code, out, err = ask(capsys, test_model_path, "--grammar", str(grammar), "hi")
    assert code == 2 and out == "" and "the grammar does not parse" in err
    assert "Traceback" not in err


def test_a_grammar_cannot_be_sent_to_the_remote(capsys, tmp_path):
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "a"\n')
    code, _, err = run_cli(capsys, "ask", "--model", "no-such-model", "--route", "remote",
                           "--grammar", str(grammar), "hi")
    assert code == 2 and "local model only" in err
