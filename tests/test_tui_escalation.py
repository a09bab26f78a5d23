"""The app when a local reply is handed to the remote model part-way: the local text folds into a
"superseded" block above the remote's answer instead of being silently replaced, and the saved
conversation holds only the answer."""

from __future__ import annotations

import contextlib
from pathlib import Path

from fake_engine import SIZE, FakeEngine, make_app, ready, reply_finished, send, wait_until
from fault_server import FaultServer, Stall, Status, reply

from localchat.tui.pacing import CPU_BOUND, REMOTE, FrameBudget, FramePacer
from localchat.tui.status import render_status
from localchat.tui.superseded_reply import SupersededReply

# The fake model gets stuck repeating itself: the loop rule hands the reply over mid-way.
LOOPING = "Sure." + " I can help with that." * 8
QUESTION = "What is the capital of France?"


@contextlib.asynccontextmanager
async def answered(store, home: Path, base_url: str):
    """The app, with the remote at ``base_url`` in mode auto, after one looping local reply to
    QUESTION has been handled; yields the pilot and the reply on screen."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{base_url}"\n')
    app = make_app(store, FakeEngine(reply=LOOPING))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, QUESTION)
        await reply_finished(pilot)
        yield pilot, app.chat_log.last_reply()


async def test_a_reply_handed_over_mid_way_keeps_the_local_text_folded_above_the_answer(
        store, isolated_home):
    with FaultServer([reply("Paris is the capital.")]) as server:
        async with answered(store, isolated_home, server.base_url) as (_, answer):
            [folded] = answer.query(SupersededReply)
            assert folded.collapsed and folded.text.startswith("Sure. I can help with that.")
            assert "repetition loop" in folded.title
            assert answer.text == "Paris is the capital." and answer.body.source == answer.text
            assert "remote (auto: loop: repetition loop" in str(answer.query_one(".caption").content)
        sent = server.requests[0].body["messages"]
    assert sent == [{"role": "user", "content": QUESTION}]  # the partial was not sent
    turns = store.turns(store.last_session().id)
    assert [t.content for t in turns] == [QUESTION, "Paris is the capital."]
    # Stored as escalated for the local model in charge (``localchat stats``' route share).
    assert (turns[-1].route, turns[-1].local_model, turns[-1].fell_back) == ("remote", "fake-model", False)


async def test_when_the_remote_fails_the_local_reply_stands_and_nothing_stays_folded(
        store, isolated_home):
    with FaultServer([Status(500), Status(500)]) as server:
        async with answered(store, isolated_home, server.base_url) as (pilot, answer):
            await wait_until(pilot, lambda: not answer.query(SupersededReply), "the fold to go")
            assert answer.text.startswith("Sure. I can help with that.")
    reply = store.turns(store.last_session().id)[-1]
    assert (reply.route, reply.local_model, reply.fell_back) == ("local", "fake-model", True)
    assert reply.route_reason.startswith("fallback:")


class BudgetSpy(FramePacer):
    """A pacer noting each frame budget the app gives it, by name."""

    def __init__(self) -> None:
        self.budgets: list[str] = []
        super().__init__()

    @property
    def budget(self) -> FrameBudget:
        return self._budget

    @budget.setter
    def budget(self, value: FrameBudget) -> None:
        self._budget = value
        self.budgets.append(value.name)


async def test_the_remote_models_text_is_drawn_at_the_remote_budget_and_a_fallback_goes_back(
        store, isolated_home):
    """Nothing local decodes while the remote answers: its frames may take more of the CPU (and
    the reply keeps no blank rows below its text); when the remote fails, the local budget is back."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    with FaultServer([reply("Paris is the capital."), Status(500), Status(500)]) as server:
        (isolated_home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n')
        app = make_app(store, FakeEngine(reply=LOOPING))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            spy = BudgetSpy()
            app.turns.pacer = spy
            await send(pilot, QUESTION)
            await reply_finished(pilot)
            assert spy.budgets[1:] == [CPU_BOUND.name, REMOTE.name]  # sent locally, then handed over
            answer = app.chat_log.last_reply()
            assert answer.text == "Paris is the capital." and answer.body.slack_rows == REMOTE.slack_rows
            spy.budgets.clear()
            await send(pilot, QUESTION)  # the remote fails this time: the local reply stands
            await wait_until(pilot, lambda: len(spy.budgets) >= 3 and app.turns.current is None,
                             "the fallback")
            assert spy.budgets == [CPU_BOUND.name, REMOTE.name, CPU_BOUND.name]
            assert app.chat_log.last_reply().body.slack_rows == CPU_BOUND.slack_rows


async def test_the_status_bar_names_the_remote_while_it_answers(store, isolated_home):
    """The route field is the model answering now: it changes when the reply is handed over, not
    only when the remote's reply is done."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    first = reply("Paris")
    first.steps[-2:] = [Stall()]  # the remote's first words, then nothing more for now
    with FaultServer([first]) as server:
        (isolated_home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n')
        app = make_app(store, FakeEngine(reply=LOOPING))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            assert app.status.info.route == "local"
            await send(pilot, QUESTION)
            await wait_until(pilot, lambda: app.chat_log.last_reply().text == "Paris", "the remote's words")
            assert app.status.info.route == "remote" and app.turns.current is not None
            assert " remote" in render_status(app.status.info)[0]
            await pilot.press("escape")
            await reply_finished(pilot)
