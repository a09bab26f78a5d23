"""The remote client and the escalation against a real OpenAI-compatible server: llama_cpp.server
with the test model, started once per test session on 127.0.0.1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from oracle import loaded_engine
from remote_fixtures import LocalFactory, settings_for, unsure, wait_until

from localchat.engine.options import Sampling
from localchat.events import Done, RouteChanged, Token
from localchat.remote.client import RemoteClient
from localchat.remote.escalate import Escalator

pytestmark = pytest.mark.model

SHORT = Sampling(temperature=0.0, max_tokens=12, seed=1)
HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
HARD = [{"role": "user", "content": "Prove by induction that 1 + 2 + ... + n = n(n+1)/2. "
                                    "Show your work step by step."}]


def test_streams_a_reply_with_timings_and_route(llama_server):
    client = RemoteClient(settings_for(llama_server, model="smollm2", timeout_s=60))
    events = list(client.stream(HELLO, SHORT, route_reason="test"))
    tokens = [e for e in events if isinstance(e, Token)]
    done = events[-1]
    assert tokens and isinstance(done, Done)
    assert done.reply == "".join(t.text for t in tokens)
    assert done.finish_reason in ("stop", "length")
    t = done.timings
    # llama_cpp.server sends no usage chunk, so the count is the number of text chunks.
    assert 0 < t.predicted_n <= SHORT.max_tokens
    assert (t.route, t.route_reason, t.model) == ("remote", "test", "smollm2")
    assert t.ttft_ms > 0


def _open_connections(port: int) -> list[str]:
    """TCP connections on ``port`` that are established or waiting for our side to close
    (CLOSE_WAIT), read from /proc/net/tcp; the listening socket is not counted."""
    states = {"01": "ESTABLISHED", "08": "CLOSE_WAIT"}
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port, remote_port = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if port in (local_port, remote_port) and fields[3] in states:
            found.append(states[fields[3]])
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux socket states")
def test_stop_closes_the_connection_and_the_server_lets_go(llama_server):
    port = int(llama_server.rsplit(":", 1)[1].split("/")[0])
    client = RemoteClient(settings_for(llama_server, timeout_s=60))
    turn = client.stream([{"role": "user", "content": "Write a very long story about a dragon."}],
                         Sampling(max_tokens=1500, seed=2))
    events = iter(turn)
    first = next(e for e in events if isinstance(e, Token))
    assert _open_connections(port)  # the stream is running
    turn.stop()
    final = next(events)
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert final.reply.startswith(first.text)
    wait_until(lambda: not _open_connections(port), timeout_s=30,
               what="both ends of the connection to close")
    # The server is free for the next request at once, not after 1500 tokens.
    assert list(client.stream(HELLO, SHORT))[-1].finish_reason in ("stop", "length")


def test_auto_routing_sends_a_hard_prompt_to_the_real_server(llama_server, tmp_path):
    local = LocalFactory([])
    esc = Escalator.from_settings(settings_for(llama_server, max_tokens=12, timeout_s=60),
                                  breaker_file=tmp_path / "breaker.json")
    turn = esc.start_turn(HARD, local, sampling=SHORT)
    events = list(turn)
    assert local.turns == []
    assert any(isinstance(e, RouteChanged) and e.route == "remote" for e in events)
    done = events[-1]
    assert isinstance(done, Done) and done.reply
    assert done.timings.route == "remote" and done.timings.route_reason.startswith("auto: rules:")


def test_an_unsure_local_reply_is_handed_to_the_real_server(llama_server, tmp_path):
    local = LocalFactory(unsure(" um", 60))
    esc = Escalator.from_settings(settings_for(llama_server, max_tokens=12, timeout_s=60),
                                  breaker_file=tmp_path / "breaker.json")
    turn = esc.start_turn(HELLO, local, sampling=SHORT)
    events = list(turn)
    assert local.turns[0].stopped.is_set()
    assert events[-1].timings.route == "remote" and events[-1].reply
    assert turn.outcome.local_partial is not None and turn.outcome.local_partial.startswith(" um0")


def test_the_real_engine_running_out_of_context_escalates_to_the_real_server(llama_server,
                                                                            test_model_path, tmp_path):
    # The reply repeats "tick, " until the context is full, and the loop rule may see that
    # first (48 characters of ", tick" against ~25 tokens of room left, which depends on the
    # reply's first words): this test is about the length rule, so the loop rule is off.
    settings = settings_for(llama_server, max_tokens=12, timeout_s=60)
    settings = replace(settings, confidence=replace(settings.confidence, escalate_on_loop=False))
    esc = Escalator.from_settings(settings, breaker_file=tmp_path / "breaker.json")
    messages = [{"role": "user", "content": "Repeat this list forever: " + "tick, " * 100}]
    with loaded_engine(test_model_path, 256, "small") as small:
        turn = esc.start_turn(messages, lambda: small.submit(
            messages, Sampling(temperature=0, repeat_penalty=1.0, max_tokens=400)), sampling=SHORT)
        events = list(turn)
    done = events[-1]
    assert done.timings.route == "remote" and "ran out of context" in done.timings.route_reason
    assert turn.outcome.local_partial  # what the engine said before the context was full, kept


def test_the_real_engine_cut_by_the_users_max_tokens_stays_local(llama_server, engine, tmp_path):
    esc = Escalator.from_settings(settings_for(llama_server, max_tokens=12, timeout_s=60),
                                  breaker_file=tmp_path / "breaker.json")
    turn = esc.start_turn(HELLO, lambda: engine.submit(HELLO, Sampling(max_tokens=4, seed=1)),
                          sampling=SHORT)
    done = list(turn)[-1]
    assert done.finish_reason == "length" and done.timings.route == "local"


# -- deciding early, with the real local model and the real server -----------------------------

# The three hard prompts of issue 16 that stayed local before the rules knew their features.
ISSUE_PROMPTS = [
    "Solve: a train leaves at 9:00 going 60 km/h and another leaves the same station at 10:00 "
    "going 90 km/h in the same direction. At what time does the second train catch up?",
    "Explain, with a worked numerical example, how backpropagation updates the weights of a "
    "small neural network.",
    "Draft a legal-style contract clause that makes a supplier liable for late delivery, with "
    "a cap on damages.",
]


@pytest.mark.parametrize("prompt", ISSUE_PROMPTS)
def test_the_issues_hard_prompts_go_to_the_real_server_before_any_local_token(
        llama_server, test_model_path, tmp_path, prompt):
    from localchat.models.gguf import parameter_count

    local = LocalFactory([])
    esc = Escalator.from_settings(settings_for(llama_server, max_tokens=12, timeout_s=60),
                                  breaker_file=tmp_path / "breaker.json")
    turn = esc.start_turn([{"role": "user", "content": prompt}], local, sampling=SHORT,
                          local_params=parameter_count(test_model_path))
    done = list(turn)[-1]
    assert local.turns == []
    assert done.timings.route == "remote" and done.timings.route_reason.startswith("auto: rules:")
    assert done.reply and turn.outcome.local_tokens == 0


def test_a_real_uncertain_start_is_handed_to_the_real_server_within_the_scored_tokens(
        llama_server, test_model_path, tmp_path):
    from localchat.chat.escalation import Escalation
    from localchat.context.chat_context import ChatContext
    from localchat.engine.engine import Engine
    from localchat.engine.options import EngineOptions

    # Limits no real start meets, so the hand-over is certain; where it happens is the point.
    esc = Escalator.from_settings(
        settings_for(llama_server, max_tokens=12, timeout_s=60, min_tokens=8, max_entropy=0.0001),
        breaker_file=tmp_path / "breaker.json")
    engine = Engine(test_model_path, EngineOptions(n_ctx=1024, gpu_layers=0, track_confidence=True,
                                                   confidence_tokens=32))
    engine.load()
    try:
        chat = ChatContext(engine, sampling=Sampling(temperature=0, max_tokens=200))
        turn = chat.send("What is the capital of France?", router=Escalation(esc, engine))
        events = list(turn)
    finally:
        engine.close()
    done = events[-1]
    assert done.timings.route == "remote" and "uncertain start" in done.timings.route_reason
    assert (turn.outcome.local_tokens, turn.outcome.late) == (8, False)
    local_text = "".join(e.text for e in events[:events.index(next(
        e for e in events if isinstance(e, RouteChanged)))] if isinstance(e, Token))
    # The kept partial may hold a token decoded while the stop took effect; never less.
    assert local_text and turn.outcome.local_partial.startswith(local_text)
    # The conversation carries on from the remote's answer; the superseded start is not in it.
    assert [(m.role, m.content) for m in chat.history] == [
        ("user", "What is the capital of France?"), ("assistant", done.reply)]
