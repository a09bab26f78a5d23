"""``localchat bench --schema``: one schema answered by localchat and by llama-cpp-python's own
response_format path on the test model; the report's rows, table and targets (speeds are the
bench's to judge, not the test's)."""

from __future__ import annotations

import json

from localchat.bench.schema import read_set, shipped_set
from localchat.cli import main
from localchat.formats import schema_format


def test_the_shipped_set_covers_the_shapes_and_converts():
    rows = read_set(shipped_set())
    text = json.dumps([schema for _, _, schema in rows])
    for keyword in ('"enum"', '"required"', '"integer"', '"number"', '"boolean"', '"null"',
                    '"items"', '"$ref"', '"format"', '"const"'):
        assert keyword in text, keyword
    for name, _, schema in rows:
        schema_format(schema, name)


def test_bench_schema_reports_validity_and_speed_side_by_side(test_model_path, tmp_path, capsys):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"name": "person", "prompt": "Describe a person.",
                               "schema": {"type": "object", "properties": {
                                   "name": {"type": "string", "maxLength": 30},
                                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                                   "required": ["name", "age"]}}) + "\n")
    code = main(["bench", "--schema", str(one), "--model", str(test_model_path), "--rounds", "1",
                 "--max-tokens", "60", "--n-ctx", "512", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    row = report["schemas"][0]
    assert row["valid"] and json.loads(row["reply"]).keys() == {"name", "age"}
    assert row["tok_s"] > 0 and row["same_reply_tok_s"] > 0 and row["ratio"] > 0
    other = row["llama_cpp_python"]
    assert other["tok_s"] > 0 and other["free_tok_s"] > 0 and "valid" in other
    assert [t["target"] for t in report["targets"]][0] == "localchat replies that parse and validate"
    assert report["targets"][0]["ok"]
    main(["bench", "--schema", str(one), "--model", str(test_model_path), "--rounds", "1",
          "--max-tokens", "60", "--n-ctx", "512", "--no-compare"])
    table = capsys.readouterr().out
    assert "person" in table and "[ok] localchat replies that parse and validate" in table
    assert "llama-cpp-python" not in table.splitlines()[1]


def test_a_bad_schema_set_is_one_line(test_model_path, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "x", "prompt": "p"}\n')
    assert main(["bench", "--schema", str(bad), "--model", str(test_model_path)]) == 1
    assert "expected" in capsys.readouterr().err
    bad.write_text('{"name": "x", "prompt": "p", "schema": {"type": "object", "not": {}}}\n')
    assert main(["bench", "--schema", str(bad), "--model", str(test_model_path)]) == 1
    assert "keyword 'not'" in capsys.readouterr().err
