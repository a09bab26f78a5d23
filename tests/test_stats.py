"""Speed over stored turns: ``localchat stats`` (p50/p95 per model) and the ``/stats`` page
with sparklines of the session's TTFT and TPOT."""

from __future__ import annotations

import json

from fake_engine import SIZE, FakeEngine, make_app, ready, reply_finished, send, wait_until

from localchat.chat.speed import sparkline
from localchat.cli import main
from localchat.events import Timings
from localchat.percentiles import percentile
from localchat.store.stats import model_stats
from localchat.tui.screens import PageScreen


def add_turns(store, session_id: int, model: str, ttfts: list[float]) -> None:
    for i, ttft in enumerate(ttfts):
        store.add_user_turn(session_id, f"q{i}")
        store.add_reply(session_id, "a", model=model, timings=Timings(
            ttft_ms=ttft, tpot_ms=ttft / 10, predicted_n=5, itl_p50_ms=ttft / 10, itl_p95_ms=ttft / 5,
            cache_n=90, prompt_n=10))


def test_percentiles_and_sparklines():
    assert percentile([5, 1, 4, 2, 3], 50) == 3 and percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == 95.05 and percentile([], 95) == 0.0
    assert sparkline([1, 5, 9]) == "▁▅█" and sparkline([2, 2]) == "▁▁" and sparkline([]) == ""


def test_stats_are_per_model_over_local_replies(store):
    session = store.create_session()
    add_turns(store, session.id, "small", [100, 200, 300, 400])
    add_turns(store, session.id, "big", [1000])
    store.add_user_turn(session.id, "remote q")
    store.add_reply(session.id, "r", model="remote-m", route="remote", timings=Timings(ttft_ms=5, predicted_n=3))
    stats = {s.model: s for s in model_stats(store)}
    assert set(stats) == {"small", "big"}
    small = stats["small"]
    # Percentiles interpolate between the nearest ranks (localchat.percentiles).
    assert (small.turns, small.ttft_ms.p50, small.ttft_ms.p95, small.reuse_percent.p50) == (4, 250, 385, 90)
    assert (small.itl_ms.p50, small.itl_ms.p95) == (25, 77)


def test_the_stats_command_prints_a_table_or_json(store, capsys):
    add_turns(store, store.create_session("s").id, "small", [100, 200])
    assert main(["stats"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("MODEL") and out[1].split()[:2] == ["small", "2"]
    assert main(["stats", "--json", "--session", "s"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["model"], row["ttft_ms_p50"], row["ttft_ms_p95"]) == ("small", 150, 195)


async def test_the_stats_page_draws_the_sessions_ttft_and_tpot(store):
    app = make_app(store, FakeEngine(reply="a b c"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
            await reply_finished(pilot)
        await send(pilot, "/stats")
        await wait_until(pilot, lambda: isinstance(app.screen, PageScreen), "the page")
        source = app.screen.query_one("Markdown").source
    assert "TTFT " in source and "TPOT " in source and "| fake-model | 3 |" in source
    line = next(row for row in source.splitlines() if row.startswith("TTFT "))
    assert len(line.split()[1]) == 3 and set(line.split()[1]) <= set("▁▂▃▄▅▆▇█")
