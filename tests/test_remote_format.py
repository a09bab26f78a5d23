"""Answer shapes over the remote route: the schema travels as OpenAI's ``response_format``
(``json_schema``; the older ``json_object`` + schema for a server that refuses it, as the real
llama_cpp.server does), the remote's answer is checked as a local one is, and a grammar turn
stays local."""

from __future__ import annotations

import json

from fault_server import FaultServer, Status, reply
from remote_fixtures import settings_for

from localchat.cli import main
from localchat.engine.options import Sampling, shaped
from localchat.events import Done
from localchat.formats import json_format, read_schema, schema_format
from localchat.remote.client import RemoteClient

PERSON = "name, age int"
# A prompt the router's rules send to the remote (see tests/test_ask.py).
HARD = ("Derive step by step, with a formal proof, the closed form of the sum of the first n "
        "cubes, then prove it by induction and discuss three edge cases.")


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_config(home, base_url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{base_url}"\n')


def test_the_real_server_answers_in_the_schema_s_shape(test_model_path, llama_server, capsys,
                                                       isolated_home):
    write_config(isolated_home, llama_server)
    code, out, err = run_cli(capsys, "ask", "--route", "remote", "--model", str(test_model_path),
                             "--temperature", "0", "--max-tokens", "80", "--schema", PERSON,
                             "Describe a person.")
    assert code == 0, err
    assert json.loads(out).keys() == {"name", "age"} and "route remote" in err


def test_the_schema_is_sent_as_json_schema_and_the_answer_checked(test_model_path, capsys,
                                                                   isolated_home):
    answers = [reply('{"name": "Ada", ', '"age": 36}'), reply("Sure! Here is a person: Ada, 36.")]
    with FaultServer(answers) as server:
        write_config(isolated_home, server.base_url)
        good = run_cli(capsys, "ask", "--route", "remote", "--model", str(test_model_path),
                       "--schema", PERSON, "Describe a person.")
        bad = run_cli(capsys, "ask", "--route", "remote", "--model", str(test_model_path),
                      "--schema", PERSON, "Describe a person.")
        sent = [request.body["response_format"] for request in server.requests]
    assert good[0] == 0 and json.loads(good[1]) == {"name": "Ada", "age": 36}
    assert sent[0] == {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": read_schema(PERSON), "strict": False}}
    code, out, err = bad
    assert code == 1 and out == "" and "the answer is not JSON" in err and "Here is a person" in err


def test_a_server_that_refuses_json_schema_is_asked_in_the_older_form_for_the_session(isolated_home):
    refusal = Status(500, error="Input should be 'text' or 'json_object' (response_format.type)")
    with FaultServer([refusal, reply('{"name": "A", "age": 1}'), reply('{"name": "B", "age": 2}')]) as server:
        client = RemoteClient(settings_for(server.base_url))
        sampling = shaped(Sampling(max_tokens=20), schema_format(read_schema(PERSON)))
        try:
            answers = [list(client.stream([{"role": "user", "content": "hi"}], sampling))[-1]
                       for _ in range(2)]
        finally:
            client.close()
        sent = [request.body["response_format"] for request in server.requests]
    assert all(isinstance(done, Done) for done in answers)
    assert [done.reply for done in answers] == ['{"name": "A", "age": 1}', '{"name": "B", "age": 2}']
    assert [form["type"] for form in sent] == ["json_schema", "json_object", "json_object"]
    assert sent[1]["schema"] == read_schema(PERSON)


def test_any_json_asks_for_a_json_object(isolated_home):
    with FaultServer([reply("{}")]) as server:
        client = RemoteClient(settings_for(server.base_url))
        try:
            list(client.stream([{"role": "user", "content": "hi"}],
                               shaped(Sampling(max_tokens=8), json_format())))
        finally:
            client.close()
        assert server.requests[0].body["response_format"] == {"type": "json_object"}


def test_a_grammar_turn_stays_local_and_cannot_be_forced_remote(test_model_path, capsys,
                                                               isolated_home, tmp_path):
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    with FaultServer([reply("remote text")]) as server:
        write_config(isolated_home, server.base_url)
        code, out, _ = run_cli(capsys, "ask", "--json", "--model", str(test_model_path),
                               "--grammar", str(grammar), HARD)
        plain = run_cli(capsys, "ask", "--json", "--model", str(test_model_path),
                        "--max-tokens", "4", HARD)
        connections = server.connections
    done = json.loads(out.splitlines()[-1])
    assert code == 0 and done["route"] == "local" and "grammar" in done["route_reason"]
    assert json.loads(plain[1].splitlines()[-1])["route"] == "remote"  # the rules escalate it
    assert connections == 1  # the plain turn's only
