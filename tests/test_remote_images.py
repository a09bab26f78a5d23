"""Pictures and the remote: a turn with pictures escalates only to a remote configured as reading
them (``[remote] images = true``), which gets OpenAI ``image_url`` parts with ``data:`` URLs;
otherwise it stays local with a notice and no image byte leaves the machine. The fault server is
the remote (it records each request's body), real image bytes come from ``image_fixture``."""

from __future__ import annotations

import base64
import json

import pytest
from fake_engine import FakeEngine
from fault_server import FaultServer, Status, reply
from image_fixture import bmp, gif, jpeg, png
from remote_fixtures import (  # noqa: F401 - llama_vision_server is a fixture
    LocalFactory,
    confident,
    events_of,
    llama_vision_server,
    settings_for,
)

from localchat.chat.escalation import Escalation
from localchat.context.chat_context import ChatContext
from localchat.engine.options import Sampling
from localchat.events import Failed, Notice, RouteChanged
from localchat.remote.escalate import IMAGES_NOT_SENT, IMAGES_STAY_LOCAL, Escalator
from localchat.remote.image_wire import data_url, mime_type, with_images
from localchat.settings import parse_settings

RED, BLUE = png(40, 30, (255, 0, 0)), png(40, 30, (0, 0, 255))
# Hard by the rules (a proof, step by step): in mode auto it goes to the remote before any local token.
HARD = "Prove by induction that the colour count is n^2, and show your work step by step."


def escalator(server: FaultServer, tmp_path, **settings) -> Escalator:
    return Escalator.from_settings(settings_for(server.base_url, **settings),
                                   breaker_file=tmp_path / "breaker.json")


def with_pictures(text: str, *images: bytes) -> dict:
    return {"role": "user", "content": text, "images": list(images)}


def image_urls(content) -> list[str]:
    return [p["image_url"]["url"] for p in content if p["type"] == "image_url"] \
        if isinstance(content, list) else []


def sent_bytes(url: str) -> tuple[str, bytes]:
    head, _, payload = url.partition(",")
    assert head.startswith("data:") and head.endswith(";base64")
    return head[len("data:"):-len(";base64")], base64.b64decode(payload, validate=True)


# -- on the wire -------------------------------------------------------------------------------

@pytest.mark.parametrize("data, mime", [(png(4, 4), "image/png"), (jpeg(8, 8), "image/jpeg"),
                                        (gif(4, 4), "image/gif"), (bmp(4, 4), "image/bmp")])
def test_a_picture_is_a_data_url_of_its_exact_bytes_with_the_mime_type_of_its_magic(data, mime):
    assert mime_type(data) == mime
    assert sent_bytes(data_url(data)) == (mime, data)


def test_a_remote_that_reads_pictures_gets_text_then_image_parts_and_no_raw_bytes():
    [message] = with_images([with_pictures("What colours?", RED, jpeg(8, 8))], reads_images=True)
    text, *images = message["content"]
    assert text == {"type": "text", "text": "What colours?"}
    assert [sent_bytes(p["image_url"]["url"]) for p in images] == [("image/png", RED),
                                                                  ("image/jpeg", jpeg(8, 8))]
    assert set(message) == {"role", "content"}
    json.dumps(message)  # nothing left that JSON cannot carry


def test_a_remote_that_reads_no_pictures_gets_the_text_and_a_note_never_the_bytes():
    messages = with_images([with_pictures("What colour?", RED), {"role": "user", "content": "hi"}],
                           reads_images=False)
    assert messages == [{"role": "user", "content": "[a picture attached here, not sent to this "
                                                    "model]\nWhat colour?"},
                        {"role": "user", "content": "hi"}]


# -- routing -----------------------------------------------------------------------------------

def test_with_images_true_a_turn_with_pictures_escalates_with_them_and_with_earlier_ones(tmp_path):
    local = LocalFactory(confident(" local", 5))
    history = [with_pictures("Remember this one.", BLUE),
               {"role": "assistant", "content": "A blue picture."},
               with_pictures(HARD, RED)]
    with FaultServer([reply("Two pictures: blue, then red.")]) as server:
        events = list(escalator(server, tmp_path, images=True).start_turn(history, local))
    assert local.turns == [] and events[-1].timings.route == "remote"
    first, answer, last = server.requests[0].body["messages"]
    assert [sent_bytes(u) for u in image_urls(first["content"])] == [("image/png", BLUE)]
    assert answer == {"role": "assistant", "content": "A blue picture."}
    assert last["content"][0] == {"type": "text", "text": HARD}
    assert [sent_bytes(u) for u in image_urls(last["content"])] == [("image/png", RED)]


@pytest.mark.parametrize("settings", [{}, {"images": False}])
def test_with_images_false_a_turn_with_pictures_stays_local_with_a_notice(tmp_path, settings):
    local = LocalFactory(confident(" red", 5))
    with FaultServer([reply("remote")]) as server:
        turn = escalator(server, tmp_path, **settings).start_turn([with_pictures(HARD, RED)],
                                                                  local)
        events = list(turn)
    assert server.connections == 0 and len(local.turns) == 1
    [notice] = [e for e in events if isinstance(e, Notice)]
    assert notice.kind == "images" and notice.message == IMAGES_STAY_LOCAL
    assert "\n" not in notice.message and "images = false" in notice.message
    assert not any(isinstance(e, RouteChanged) for e in events)
    done = events[-1]
    assert done.reply == " red0 red1 red2 red3 red4" and done.timings.route == "local"
    assert done.timings.route_reason == "local: pictures the remote does not read"


def test_with_images_false_a_forced_remote_turn_with_pictures_fails_in_one_line(tmp_path):
    local = LocalFactory(confident(" red", 5))
    with FaultServer([reply("remote")]) as server:
        events = list(escalator(server, tmp_path).start_turn([with_pictures("Colour?", RED)],
                                                             local, route="remote"))
    assert server.connections == 0 and local.turns == []
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert events[0].message == IMAGES_NOT_SENT


def test_with_images_false_a_later_turn_escalates_without_the_earlier_pictures_bytes(tmp_path):
    local = LocalFactory(confident(" local", 5))
    history = [with_pictures("What colour?", RED), {"role": "assistant", "content": "Red."},
               {"role": "user", "content": HARD}]
    with FaultServer([reply("By induction.")]) as server:
        events = list(escalator(server, tmp_path).start_turn(history, local))
        body = server.requests[0].body
    assert events[-1].timings.route == "remote"
    assert body["messages"][0] == {"role": "user", "content": "[a picture attached here, not "
                                                              "sent to this model]\nWhat colour?"}
    wire = json.dumps(body)
    assert base64.b64encode(RED).decode() not in wire and "image_url" not in wire


def test_without_a_remote_a_turn_with_pictures_stays_local_with_no_notice(tmp_path):
    local = LocalFactory(confident(" red", 5))
    esc = Escalator.from_settings(parse_settings({"remote": {"images": True}}).remote)
    events = list(esc.start_turn([with_pictures(HARD, RED)], local))
    assert esc.client is None and not any(isinstance(e, Notice) for e in events)
    assert events[-1].timings.route_reason == "local: remote off"


def test_a_remote_that_fails_on_pictures_falls_back_to_the_local_reply(tmp_path):
    local = LocalFactory(confident(" red", 5))
    refusal = Status(400, "image input is not supported by this model")
    with FaultServer([refusal]) as server:
        turn = escalator(server, tmp_path, images=True).start_turn([with_pictures(HARD, RED)],
                                                                   local)
        events = list(turn)
    assert len(server.requests) == 1  # a 4xx is not retried
    assert image_urls(server.requests[0].body["messages"][0]["content"])
    [back] = [e for e in events if isinstance(e, RouteChanged) and e.route == "local"]
    assert "image input is not supported" in back.message and "answering locally" in back.message
    done = events[-1]
    assert done.reply == " red0 red1 red2 red3 red4" and done.timings.fell_back
    assert done.timings.route_reason.startswith("fallback: remote failed (remote answered 400")
    assert turn.outcome.fell_back


def test_images_is_a_remote_setting_off_by_default_and_checked():
    assert parse_settings({}).remote.images is False
    assert parse_settings({"remote": {"images": True}}).remote.images is True
    with pytest.raises(Exception, match="remote.images must be true or false"):
        parse_settings({"remote": {"images": "yes"}})


# -- through the conversation ------------------------------------------------------------------

def test_the_conversation_sends_an_earlier_messages_picture_to_a_remote_that_reads_them(tmp_path):
    engine = FakeEngine(reply="A red picture.")
    engine.load()
    chat = ChatContext(engine)
    with FaultServer([reply("Still red.")]) as server:
        router = Escalation(escalator(server, tmp_path, images=True), engine, "remote")
        events_of(chat.send("What colour is this?", images=(RED,)))  # answered locally
        final = events_of(chat.send("And now, is it still that colour?", router=router))[-1]
        [request] = server.requests
    assert final.reply == "Still red." and final.timings.route == "remote"
    first, answer, last = request.body["messages"]
    assert first["content"][0] == {"type": "text", "text": "What colour is this?"}
    assert [sent_bytes(u) for u in image_urls(first["content"])] == [("image/png", RED)]
    assert answer == {"role": "assistant", "content": "A red picture."}
    assert last == {"role": "user", "content": "And now, is it still that colour?"}
    assert chat.history[0].images == (RED,)  # the history keeps them for the next turn


def test_a_message_too_long_for_the_local_context_fails_when_its_pictures_cannot_go(tmp_path):
    local = LocalFactory(confident(" red", 5))
    engine = FakeEngine()
    with FaultServer([reply("remote")]) as server:
        router = Escalation(escalator(server, tmp_path), engine)
        events = events_of(router.start([with_pictures("a long one", RED)], local, overlong=True,
                                        sampling=Sampling()))
    assert server.connections == 0 and local.turns == []
    assert [type(e) for e in events] == [Failed] and events[0].message == IMAGES_NOT_SENT


@pytest.mark.parametrize("reads_images, turns_sent", [(True, 1), (False, 3)])
def test_pictures_count_against_the_remotes_budget_only_where_they_are_sent(
        tmp_path, reads_images, turns_sent):
    history = [with_pictures("Remember these.", RED, BLUE),  # two pictures: ~1,536 tokens
               {"role": "assistant", "content": "Red and blue."},
               {"role": "user", "content": "Which came first?"}]
    with FaultServer([reply("Red.")]) as server:
        esc = escalator(server, tmp_path, images=reads_images, max_context_tokens=1000,
                        max_tokens=16)
        events_of(esc.start_turn(history, LocalFactory([]), route="remote"))
        sent = server.requests[0].body["messages"]
    assert len(sent) == turns_sent and sent[-1]["content"] == "Which came first?"


@pytest.mark.model
@pytest.mark.parametrize("reads_images, encoded", [(True, 1), (False, 0)])
def test_a_real_server_reads_the_earlier_messages_picture_only_when_it_is_sent(
        tmp_path, llama_vision_server, reads_images, encoded):  # noqa: F811 - the fixture
    history = [with_pictures("Remember this one.", BLUE),
               {"role": "assistant", "content": "A blue picture."},
               {"role": "user", "content": "Which colour was it?"}]
    esc = Escalator.from_settings(settings_for(llama_vision_server.base_url, images=reads_images,
                                               timeout_s=60, max_tokens=4),
                                  breaker_file=tmp_path / "breaker.json")
    before = llama_vision_server.pictures_encoded()
    events = events_of(esc.start_turn(history, LocalFactory([]), route="remote"))
    assert events[-1].timings.route == "remote" and events[-1].finish_reason != "aborted"
    assert llama_vision_server.pictures_encoded() - before == encoded
