"""The app when a local reply is handed to the remote model part-way: the local text folds into a
"superseded" block above the remote's answer instead of being silently replaced, and the saved
conversation holds only the answer."""

from __future__ import annotations

import pytest

from fake_engine import SIZE, FakeEngine, make_app, ready, reply_finished, send, wait_until
from fault_server import FaultServer, Status, reply
from localchat.store import Store
from localchat.tui.superseded import SupersededReply

# The fake model gets stuck repeating itself: the loop rule hands the reply over mid-way.
LOOPING = "Sure." + " I can help with that." * 8


@pytest.fixture
def store():
    with Store.open() as s:
        yield s


def remote_config(home, base_url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{base_url}"\n')


async def test_a_reply_handed_over_mid_way_keeps_the_local_text_folded_above_the_answer(
        store, isolated_home):
    with FaultServer([reply("Paris is the capital.")]) as server:
        remote_config(isolated_home, server.base_url)
        app = make_app(store, FakeEngine(reply=LOOPING))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await send(pilot, "What is the capital of France?")
            await reply_finished(pilot)
            answer = app.chat_log.last_reply()
            [folded] = answer.query(SupersededReply)
            assert folded.collapsed and folded.text.startswith("Sure. I can help with that.")
            assert "repetition loop" in folded.title
            assert answer.text == "Paris is the capital." and answer.body.source == answer.text
            assert "remote (auto: loop: repetition loop" in str(
                answer.query_one(".caption").render())
        sent = server.requests[0].body["messages"]
    assert sent[-1] == {"role": "user", "content": "What is the capital of France?"}
    assert not any(m["role"] == "assistant" for m in sent)  # the partial was not sent
    turns = store.turns(store.last_session().id)
    assert [t.content for t in turns] == ["What is the capital of France?", "Paris is the capital."]


async def test_when_the_remote_fails_the_local_reply_stands_and_nothing_stays_folded(
        store, isolated_home):
    with FaultServer([Status(500), Status(500)]) as server:
        remote_config(isolated_home, server.base_url)
        app = make_app(store, FakeEngine(reply=LOOPING))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await send(pilot, "What is the capital of France?")
            await reply_finished(pilot)
            answer = app.chat_log.last_reply()
            await wait_until(pilot, lambda: not answer.query(SupersededReply), "the fold to go")
            assert answer.text.startswith("Sure. I can help with that.")
