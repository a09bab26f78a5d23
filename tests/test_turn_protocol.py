"""One Turn protocol (localchat.events.Turn) for every producer of a turn: the local engine's
TurnHandle, the remote client's RemoteTurn and the escalator's EscalatedTurn. Whoever reads the
final event already sees what ``on_finish`` did, and ``finished``/``result`` say the same; once
``stop()`` has returned, the next event a reader gets is the final one, whatever the producer had
queued (so these tests hold whatever the threads' timing)."""

from __future__ import annotations

import threading

from fault_server import FaultServer, Stall, Stream, chunk, reply
from remote_fixtures import LocalFactory, confident, settings_for, wait_until

from localchat.engine.turn import Outbox, TurnHandle
from localchat.events import Done, Failed, Token, Turn
from localchat.remote.client import RemoteClient
from localchat.remote.escalate import Escalator

MESSAGES = [{"role": "user", "content": "Hi"}]


def read_checking_on_finish(turn: Turn) -> Done | Failed:
    """Read ``turn`` to its end; assert that when the final event arrives, the callback has
    already seen it and the turn says it is finished."""
    seen: list[Done | Failed] = []
    turn.on_finish(seen.append)
    final = None
    for event in turn:
        if isinstance(event, (Done, Failed)):
            assert seen == [event] and turn.finished and turn.result is event
            final = event
    assert final is not None
    late: list[Done | Failed] = []
    turn.on_finish(late.append)  # after the end: runs at once
    assert late == [final]
    return final


def test_a_local_turn_runs_on_finish_before_its_final_event_is_read():
    handle = TurnHandle()

    def engine_thread() -> None:
        handle.emit(Token("hi"))
        handle.emit(Done("hi", "stop"))

    threading.Timer(0.05, engine_thread).start()
    final = read_checking_on_finish(handle)
    assert isinstance(final, Done) and final.reply == "hi"


def test_a_remote_turn_runs_on_finish_before_its_final_event_is_read():
    with FaultServer([reply("Hello", " there")]) as server:
        turn = RemoteClient(settings_for(server.base_url)).stream(MESSAGES)
        final = read_checking_on_finish(turn)
    assert isinstance(final, Done) and final.reply == "Hello there"


def test_a_stopped_remote_turn_ends_once_with_the_partial_reply():
    with FaultServer([Stream([chunk("one"), Stall()])]) as server:
        turn = RemoteClient(settings_for(server.base_url, timeout_s=60)).stream(MESSAGES)
        seen: list[Done | Failed] = []
        turn.on_finish(seen.append)
        events = iter(turn)
        assert next(events).text == "one"
        turn.stop()
        final = next(events)
    assert isinstance(final, Done) and final.finish_reason == "aborted" and final.reply == "one"
    assert seen == [final] and turn.result is final and turn.finished


def test_an_escalated_turn_runs_on_finish_before_its_final_event_is_read(tmp_path):
    local = LocalFactory(confident(" word", 5))
    with FaultServer([reply("unused")]) as server:
        esc = Escalator.from_settings(settings_for(server.base_url),
                                      breaker_file=tmp_path / "breaker.json")
        turn = esc.start_turn(MESSAGES, local, route="local")
        final = read_checking_on_finish(turn)
        esc.close()
    assert isinstance(final, Done) and final.timings.route_reason == "user: local"
    assert turn.outcome is not None and turn.outcome.route == "local"


def test_after_stop_a_local_turn_delivers_its_final_event_and_no_queued_token():
    handle = TurnHandle()
    for text in ("one", " two", " three"):  # the engine is ahead of the reader
        handle.emit(Token(text))
    events = iter(handle)
    assert next(events) == Token("one")
    handle.stop()
    handle.emit(Done("one two three", "aborted"))
    final = next(events)
    # The final event holds what the reader was not given: whoever shows the reply shows Done.
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert final.reply == "one two three"


def test_after_stop_a_remote_turn_delivers_its_final_event_and_no_queued_token():
    with FaultServer([reply("one", " two", " three")]) as server:
        turn = RemoteClient(settings_for(server.base_url)).stream(MESSAGES)
        events = iter(turn)
        assert next(events) == Token("one")
        assert turn.wait(10) is not None  # ended: every token is queued
        turn.stop()
        final = next(events)
    assert isinstance(final, Done) and final.finish_reason == "stop"  # it had ended first
    assert final.reply == "one two three"

    with FaultServer([Stream([chunk("one"), chunk(" two"), chunk(" three"), Stall()])]) as server:
        turn = RemoteClient(settings_for(server.base_url, timeout_s=60)).stream(MESSAGES)
        events = iter(turn)
        assert next(events) == Token("one")
        wait_until(server.stall_started.is_set, what="the server to stall")
        turn.stop()
        final = next(events)
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert final.reply in ("one", "one two", "one two three")


def test_after_stop_an_escalated_turn_delivers_its_final_event_and_no_queued_token(tmp_path):
    local = LocalFactory(confident(" word", 5))
    script = [Stream([chunk("one"), chunk(" two"), chunk(" three"), Stall()])]
    with FaultServer(script) as server:
        esc = Escalator.from_settings(settings_for(server.base_url, timeout_s=60),
                                      breaker_file=tmp_path / "breaker.json")
        turn = esc.start_turn(MESSAGES, local, route="remote")
        events = iter(turn)
        assert next(events) == Token("one")
        wait_until(server.stall_started.is_set, what="the server to stall")
        turn.stop()
        final = next(events)
        esc.close()
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert final.reply.startswith("one") and turn.result is final


def test_a_held_turn_waits_after_its_first_text_until_it_was_shown():
    handle = TurnHandle()
    handle.hold_first_text(30.0)
    emitted: list[str] = []

    def produce() -> None:
        for text in ("", "Hi", " there"):  # a token without text is not held
            handle.emit(Token(text))
            emitted.append(text)
        handle.emit(Done("Hi there", "stop"))

    producer = threading.Thread(target=produce)
    producer.start()
    events = iter(handle)
    assert [next(events).text, next(events).text] == ["", "Hi"]
    producer.join(0.2)
    assert emitted == [""]  # held: the next token waits for the first text to be shown
    handle.first_text_shown()
    producer.join(5)
    assert emitted == ["", "Hi", " there"]
    assert isinstance(read_checking_on_finish(handle), Done)


def test_events_emitted_while_an_outbox_collects_reach_the_reader_when_it_is_done():
    """The engine thread stepping slots on holds each turn's events back until the step ends
    (the readers wake as it decodes), in order; a turn's held-for first text goes out at once
    with what was held before it; other threads' events are never held."""
    outbox = Outbox()
    handle, held, other = TurnHandle(), TurnHandle(), TurnHandle()
    for turn in (handle, held, other):
        turn.deliver_through(outbox)
    held.hold_first_text(30.0)
    with outbox.collecting():
        handle.emit(Token("Hi"))
        handle.emit(Token(" there"))
        elsewhere = threading.Thread(target=lambda: other.emit(Token("now")))
        elsewhere.start()
        elsewhere.join(5)
        assert [handle._events.qsize(), other._events.qsize()] == [0, 1]
        held.emit(Token(""))
        threading.Thread(target=held.first_text_shown).start()
        held.emit(Token("Yes"))  # released with what came before: else it would wait 30 s
        assert [handle._events.qsize(), held._events.qsize()] == [2, 2]
        handle.emit(Token("!"))
        assert handle._events.qsize() == 2
    assert handle._events.qsize() == 3
    for turn in (handle, held):
        turn.emit(Done("", "stop"))
    assert [e.text for e in handle if isinstance(e, Token)] == ["Hi", " there", "!"]
    assert [e.text for e in held if isinstance(e, Token)] == ["", "Yes"]


def test_a_hold_lasts_its_timeout_at_most_and_a_turn_not_held_never_waits():
    held, free = TurnHandle(), TurnHandle()
    held.hold_first_text(0.05)
    for handle in (held, free):
        handle.emit(Token("Hi"))
        handle.emit(Token(" there"))  # the hold is for the first text only
        handle.emit(Done("Hi there", "stop"))
        assert [e.text for e in handle if isinstance(e, Token)] == ["Hi", " there"]
