"""Routing a turn: local, remote, or local first and then the remote — with the fault server as
the remote and a scripted local reply, so every decision can be checked on the wire."""

from __future__ import annotations

import pytest
from fault_server import FaultServer, Stall, Status, Stream, chunk, reply
from remote_fixtures import LocalFactory, confident, hesitant, settings_for, sure, text_of, unsure

from localchat.events import Failed, Notice, RouteChanged, Token
from localchat.remote.escalate import Escalator
from localchat.settings.remote import RemoteSettings

EASY = [{"role": "user", "content": "What is the capital of France?"}]
HARD = [{"role": "user", "content": "Prove by induction that the sum of the first n odd numbers "
                                    "is n^2, and show your work step by step."}]


def escalator(server: FaultServer, tmp_path, **settings) -> Escalator:
    return Escalator.from_settings(settings_for(server.base_url, **settings),
                                   breaker_file=tmp_path / "breaker.json")


def notices(events, kind):
    return [e for e in events if isinstance(e, Notice) and e.kind == kind]


def route_changes(events, route):
    return [e for e in events if isinstance(e, RouteChanged) and e.route == route]


# -- mode off: nothing leaves the machine ------------------------------------------------------

@pytest.mark.parametrize("route", ["auto", "remote", "local"])
def test_mode_off_makes_no_connection_whatever_the_route_or_prompt(route):
    local = LocalFactory(unsure(" hm", 40), finish_reason="length")
    with FaultServer([reply("remote answer")]) as server:
        settings = RemoteSettings(mode="off", base_url=server.base_url)
        esc = Escalator.from_settings(settings)
        assert esc.client is None
        events = list(esc.start_turn(HARD, local, route=route))
    assert server.connections == 0
    if route == "remote":
        assert len(events) == 1 and isinstance(events[0], Failed) and "off" in events[0].message
    else:
        assert events[-1].timings.route == "local"


def test_route_local_never_contacts_the_remote_even_for_a_hard_unsure_reply(tmp_path):
    local = LocalFactory(unsure(" hm", 40))
    with FaultServer([reply("remote answer")]) as server:
        events = list(escalator(server, tmp_path).start_turn(HARD, local, route="local"))
    assert server.connections == 0
    assert events[-1].timings.route_reason == "user: local"


# -- rules before generation -------------------------------------------------------------------

def test_a_hard_prompt_goes_to_the_remote_without_starting_the_local_model(tmp_path):
    local = LocalFactory(confident(" local", 5))
    with FaultServer([reply("By induction", "...")]) as server:
        turn = escalator(server, tmp_path, model="big").start_turn(HARD, local)
        events = list(turn)
    assert local.turns == []
    assert route_changes(events, "remote")[0].message.startswith("asking big: rules:")
    done = events[-1]
    assert done.reply == "By induction..."
    assert (done.timings.route, done.timings.model) == ("remote", "big")
    assert done.timings.route_reason.startswith("auto: rules: ") and "proof" in done.timings.route_reason
    assert turn.outcome.route == "remote" and turn.outcome.escalated
    assert server.requests[0].body["messages"] == HARD


def test_an_easy_confident_reply_stays_local(tmp_path):
    local = LocalFactory(confident(" Paris", 30))
    with FaultServer([reply("remote")]) as server:
        turn = escalator(server, tmp_path).start_turn(EASY, local)
        events = list(turn)
    assert server.connections == 0
    assert events[-1].timings.route == "local"
    assert events[-1].timings.route_reason.startswith("local: no hard-task features")
    assert turn.outcome.route == "local" and not turn.outcome.escalated


# -- confidence during generation --------------------------------------------------------------

def test_low_confidence_stops_the_local_reply_and_the_remote_answers(tmp_path):
    local = LocalFactory(unsure(" maybe", 200))
    with FaultServer([reply("The answer", " is Paris.")]) as server:
        turn = escalator(server, tmp_path, min_tokens=16).start_turn(EASY, local)
        events = list(turn)
    assert local.turns[0].stopped.is_set()
    local_tokens = events[:events.index(route_changes(events, "remote")[0])]
    assert len([e for e in local_tokens if isinstance(e, Token)]) == 16
    done = events[-1]
    assert done.reply == "The answer is Paris." and done.timings.route == "remote"
    assert done.timings.route_reason.startswith("auto: low-confidence: ")
    assert turn.outcome.local_partial == text_of(unsure(" maybe", 16))


def test_a_reply_cut_by_length_is_escalated_after_it_ends(tmp_path):
    local = LocalFactory(confident(" word", 20), finish_reason="length")
    with FaultServer([reply("complete answer")]) as server:
        turn = escalator(server, tmp_path).start_turn(EASY, local)
        events = list(turn)
    assert events[-1].reply == "complete answer"
    assert turn.outcome.local_partial == text_of(confident(" word", 20))
    assert "length" in events[-1].timings.route_reason


def test_a_reply_cut_by_max_tokens_stays_local(tmp_path):
    local = LocalFactory(confident(" word", 20), finish_reason="length", context_full=False)
    with FaultServer([reply("complete answer")]) as server:
        turn = escalator(server, tmp_path).start_turn(EASY, local)
        events = list(turn)
        assert server.requests == []
    assert events[-1].timings.route == "local" and events[-1].finish_reason == "length"


def test_a_failed_automatic_escalation_keeps_the_local_reply_with_a_notice(tmp_path):
    local = LocalFactory(unsure(" maybe", 40))
    with FaultServer([Status(500, "overloaded")]) as server:
        turn = escalator(server, tmp_path).start_turn(EASY, local)
        events = list(turn)
    assert len(server.requests) == 2  # the client's one retry, and no other remote
    [fallback] = route_changes(events, "local")
    assert "remote answered 500: overloaded" in fallback.message
    done = events[-1]
    assert done.reply == text_of(unsure(" maybe", 16)) and done.timings.route == "local"
    assert done.timings.route_reason.startswith("fallback: remote failed")
    assert turn.outcome.fell_back and len(local.turns) == 1


def test_a_failed_escalation_by_the_rules_answers_locally_with_a_notice(tmp_path):
    local = LocalFactory(unsure(" local", 40))  # unsure, yet no second escalation
    with FaultServer([Status(500)]) as server:
        events = list(escalator(server, tmp_path).start_turn(HARD, local))
    assert len(server.requests) == 2
    assert len(route_changes(events, "local")) == 1 and len(route_changes(events, "remote")) == 1
    assert events[-1].reply == text_of(unsure(" local", 40)) and events[-1].timings.route == "local"


# -- circuit breaker ---------------------------------------------------------------------------

def test_once_the_breaker_is_open_automatic_escalation_is_skipped_with_a_notice(tmp_path):
    with FaultServer([Status(500)]) as server:
        esc = escalator(server, tmp_path, breaker_failures=2, breaker_cooldown_s=600)
        for _ in range(2):
            list(esc.start_turn(HARD, LocalFactory(confident(" ok", 3))))
        assert len(server.requests) == 4
        local = LocalFactory(unsure(" ok", 40))
        events = list(esc.start_turn(HARD, local))
    assert len(server.requests) == 4  # nothing more was sent
    [skipped] = notices(events, "breaker")
    assert "marked down after 2 failed turns" in skipped.message
    # ...and the unsure local reply was not escalated either.
    assert events[-1].reply == text_of(unsure(" ok", 40))
    assert events[-1].timings.route_reason.startswith("local (breaker): rules:")


def test_a_user_forced_remote_turn_reports_failure_in_one_line_even_when_down(tmp_path):
    with FaultServer([Status(502, "bad gateway")]) as server:
        esc = escalator(server, tmp_path, breaker_failures=1)
        events = list(esc.start_turn(EASY, LocalFactory([]), route="remote"))
    assert isinstance(events[-1], Failed)
    assert events[-1].message.startswith("remote answered 502: bad gateway (remote marked down")
    assert "\n" not in events[-1].message


# -- mode ask ----------------------------------------------------------------------------------

def test_mode_ask_asks_once_and_remembers_the_answer_for_the_session(tmp_path):
    questions = []

    def ask_user(question: str) -> bool:
        questions.append(question)
        return False

    with FaultServer([reply("remote")]) as server:
        esc = Escalator.from_settings(settings_for(server.base_url, mode="ask"), ask_user=ask_user,
                                      breaker_file=tmp_path / "b.json")
        first = list(esc.start_turn(HARD, LocalFactory(confident(" a", 3))))
        second = list(esc.start_turn(HARD, LocalFactory(confident(" b", 3))))
    assert len(questions) == 1 and "Send it there?" in questions[0]
    assert server.connections == 0
    assert first[-1].timings.route_reason.startswith("local (declined): rules:")
    assert second[-1].reply == text_of(confident(" b", 3))


def test_mode_ask_with_an_accepted_offer_escalates(tmp_path):
    with FaultServer([reply("remote says hi")]) as server:
        esc = Escalator.from_settings(settings_for(server.base_url, mode="ask"),
                                      ask_user=lambda q: True, breaker_file=tmp_path / "b.json")
        events = list(esc.start_turn(EASY, LocalFactory(unsure(" eh", 40))))
    assert events[-1].reply == "remote says hi" and esc.ask_choice is True


def test_mode_ask_without_a_way_to_ask_offers_in_a_notice(tmp_path):
    with FaultServer([reply("remote")]) as server:
        esc = Escalator.from_settings(settings_for(server.base_url, mode="ask"),
                                      breaker_file=tmp_path / "b.json")
        events = list(esc.start_turn(HARD, LocalFactory(confident(" a", 3))))
    assert server.connections == 0
    [offer] = notices(events, "offer")
    assert "/big" in offer.message and events[-1].timings.route == "local"


# -- stop --------------------------------------------------------------------------------------

def test_stop_during_the_escalated_remote_reply_ends_the_turn_at_once(tmp_path):
    with FaultServer([Stream([chunk("partial"), Stall()])]) as server:
        esc = escalator(server, tmp_path, timeout_s=60)
        turn = esc.start_turn(HARD, LocalFactory([]))
        events = []
        for event in turn:
            events.append(event)
            if isinstance(event, Token):
                assert server.stall_started.wait(10)
                turn.stop()
        assert server.client_closed_during_stall.wait(10)
    done = events[-1]
    assert done.finish_reason == "aborted" and done.reply == "partial"
    assert done.timings.route == "remote"


def test_stop_before_iteration_starts_nothing_remote(tmp_path):
    with FaultServer([reply("remote")]) as server:
        turn = escalator(server, tmp_path).start_turn(EASY, LocalFactory(unsure(" x", 40)))
        turn.stop()
        events = list(turn)
    assert server.connections == 0
    assert events[-1].finish_reason == "aborted"


def test_the_remote_gets_the_conversation_trimmed_to_its_budget(tmp_path):
    old = [{"role": "user", "content": "x" * 4000}, {"role": "assistant", "content": "y" * 4000}]
    recent = [{"role": "user", "content": "short"}, {"role": "assistant", "content": "reply"}]
    messages = [{"role": "system", "content": "Be brief."}, *old, *recent, HARD[0]]
    with FaultServer([reply("ok")]) as server:
        esc = escalator(server, tmp_path, max_context_tokens=1024, max_tokens=256)
        list(esc.start_turn(messages, LocalFactory([])))
    assert server.requests[0].body["messages"] == [messages[0], *recent, HARD[0]]


def test_a_local_reply_stuck_in_a_loop_is_escalated(tmp_path):
    local = LocalFactory([(" I can help with that.", 0.9)] * 10)
    with FaultServer([reply("A real answer.")]) as server:
        events = list(escalator(server, tmp_path).start_turn(EASY, local))
    assert events[-1].reply == "A real answer."
    assert events[-1].timings.route_reason.startswith("auto: loop: repetition loop")


# -- deciding early, and saying so when it was late ---------------------------------------------

def test_an_uncertain_start_is_handed_over_within_the_first_tokens_with_the_visible_history_only(tmp_path):
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "What is the capital of France?"}]
    local = LocalFactory(hesitant(" um", 200))
    with FaultServer([reply("Paris.")]) as server:
        turn = escalator(server, tmp_path, min_tokens=16, max_entropy=2.0).start_turn(history, local)
        events = list(turn)
    done = events[-1]
    assert done.reply == "Paris." and done.timings.route == "remote"
    assert done.timings.route_reason.startswith("auto: low-confidence: uncertain start: mean entropy")
    assert "late" not in done.timings.route_reason
    assert (turn.outcome.local_tokens, turn.outcome.late) == (16, False)
    # The superseded partial is kept aside, never sent: the remote sees the conversation as is.
    assert turn.outcome.local_partial == text_of(hesitant(" um", 16))
    assert server.requests[0].body["messages"] == history


def test_a_confident_start_stays_local_whatever_follows_without_numbers(tmp_path):
    local = LocalFactory(sure(" fine", 120))
    with FaultServer([reply("remote")]) as server:
        turn = escalator(server, tmp_path, max_entropy=2.0, min_margin=0.3).start_turn(EASY, local)
        events = list(turn)
    assert server.connections == 0
    assert events[-1].timings.route == "local" and turn.outcome.local_tokens == 0


def test_an_escalation_after_more_than_64_local_tokens_is_reported_as_late(tmp_path):
    # Sure of its start, then stuck in a loop: only the loop rule can fire, at the third copy.
    local = LocalFactory(sure(" ok", 70) + [Token(" I can help with that.")] * 10)
    with FaultServer([reply("A real answer.")]) as server:
        turn = escalator(server, tmp_path, max_entropy=2.0).start_turn(EASY, local)
        events = list(turn)
    reason = events[-1].timings.route_reason
    assert reason.startswith("auto: late, after 73 local tokens: loop: repetition loop")
    assert turn.outcome.late and turn.outcome.local_tokens == 73
    assert route_changes(events, "remote")[0].message.startswith("asking the remote model: late, after 73")


def test_the_local_models_size_moves_the_rules_threshold(tmp_path):
    # Medical advice (score 3): over a 135M model's threshold, under an 8B model's.
    prompt = [{"role": "user", "content": "My father takes warfarin and was just prescribed "
                                          "amoxicillin. What interactions should we watch for, "
                                          "and how should the dosage be monitored?"}]
    with FaultServer([reply("remote"), reply("remote")]) as server:
        esc = escalator(server, tmp_path)
        small = list(esc.start_turn(prompt, LocalFactory(sure(" a", 3)), local_params=135_000_000))
        large = list(esc.start_turn(prompt, LocalFactory(sure(" b", 3)), local_params=8_000_000_000))
    assert small[-1].timings.route == "remote" and small[-1].timings.route_reason.startswith("auto: rules:")
    assert large[-1].timings.route == "local" and "(score 3 < 3.17)" in large[-1].timings.route_reason
