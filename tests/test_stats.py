"""Speed and routing over stored turns: ``localchat stats`` (route share, p50/p95 and TPOT's
tail per model) and the ``/stats`` page with sparklines of the session's TTFT and TPOT."""

from __future__ import annotations

import json
import sqlite3
import statistics

from fake_engine import SIZE, FakeEngine, make_app, ready, reply_finished, send, wait_until

from localchat.chat.speed import sparkline
from localchat.cli import main
from localchat.events import Timings
from localchat.percentiles import percentile
from localchat.store import Store, branches, schema
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
    store.add_reply(session.id, "r", model="remote-m", route="remote", local_model="big",
                    timings=Timings(ttft_ms=5, predicted_n=3))
    stats = {s.model: s for s in model_stats(store)}
    assert set(stats) == {"small", "big"}  # a remote reply counts for the local model in charge
    small = stats["small"]
    # Percentiles interpolate between the nearest ranks (localchat.percentiles).
    assert (small.turns, small.ttft_ms.p50, small.ttft_ms.p95, small.reuse_percent.p50) == (4, 250, 385, 90)
    assert (small.itl_ms.p50, small.itl_ms.p95) == (25, 77)
    assert (stats["big"].turns, stats["big"].ttft_ms.p50, stats["big"].routes.replies) == (1, 1000, 2)


def test_tpot_has_a_p99_and_a_standard_deviation_beside_p50_and_p95(store):
    session = store.create_session()
    ttfts = [100.0] * 99 + [1000.0]  # one slow reply in a hundred: TPOT 10 ms, once 100 ms
    add_turns(store, session.id, "small", ttfts)
    [small] = model_stats(store)
    tpots = [t / 10 for t in ttfts]
    assert (small.tpot_ms.p50, small.tpot_ms.p95) == (10, 10)
    assert small.tpot_ms.p99 == percentile(tpots, 99) and round(small.tpot_ms.p99, 2) == 10.9
    assert small.tpot_ms.std == statistics.pstdev(tpots) and 8.9 < small.tpot_ms.std < 9.0
    # The tail of the CLI table: p99 beside p50/p95, and the jitter.
    row = small.to_dict()
    assert (row["tpot_ms_p50"], row["tpot_ms_p95"], row["tpot_ms_p99"], row["tpot_ms_std"]) == (10, 10, 10.9, round(statistics.pstdev(tpots), 2))


def add_routed(store, session_id: int, local: str, route: str, *, fell_back: bool = False) -> None:
    store.add_user_turn(session_id, "q")
    model = "remote-m" if route == "remote" else local
    store.add_reply(session_id, "a", model=model, route=route, local_model=local, fell_back=fell_back,
                    timings=Timings(ttft_ms=100, tpot_ms=10, predicted_n=5))


def test_the_route_share_counts_local_escalated_and_fallen_back_replies_per_local_model(store):
    session = store.create_session()
    for _ in range(6):
        add_routed(store, session.id, "small", "local")
    for _ in range(3):
        add_routed(store, session.id, "small", "remote")
    add_routed(store, session.id, "small", "local", fell_back=True)
    add_routed(store, session.id, "big", "remote")
    stats = {s.model: s for s in model_stats(store)}
    small, big = stats["small"], stats["big"]
    assert (small.routes.local, small.routes.escalated, small.routes.fallback) == (6, 3, 1)
    assert (small.routes.hit_rate, small.routes.degrade_rate) == (0.6, 0.1)
    assert small.turns == 7  # speed is over the local replies, a fallback's included
    assert str(small.routes) == "60 / 30 / 10"
    # A model whose every reply went to the remote still has its row, with no speed figures.
    assert (big.turns, big.routes.hit_rate, str(big.routes)) == (0, 0.0, "0 / 100 / 0")


def test_the_stats_command_shows_the_route_share_and_says_what_a_high_hit_rate_can_mean(store, capsys):
    session = store.create_session("s")
    add_routed(store, session.id, "small", "local")
    add_routed(store, session.id, "small", "remote")
    add_routed(store, session.id, "all-remote", "remote")
    assert main(["stats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "LOCAL/ESC/FALLBACK %" in lines[0] and "TPOT ms p50/p95/p99" in lines[0] and "TPOT SD ms" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["small"][:6] == ["small", "2", "50", "/", "50", "/"]
    assert rows["all-remote"][1:7] == ["1", "0", "/", "100", "/", "0"] and rows["all-remote"][7:] == ["-"] * 5
    assert main(["stats", "--json"]) == 0
    row = {r["model"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}["small"]
    assert (row["replies"], row["replies_local"], row["replies_escalated"], row["replies_fallback"]) == (2, 1, 1, 0)
    assert (row["hit_rate"], row["degrade_rate"]) == (0.5, 0.0) and "tpot_ms_p99" in row and "tpot_ms_std" in row
    try:
        main(["stats", "--help"])
    except SystemExit:
        pass
    help_text = " ".join(capsys.readouterr().out.split())
    assert "a local hit rate above ~90% can mean the router is too timid" in help_text


def test_a_version_4_database_keeps_its_replies_and_learns_their_route_outcome(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    schema.upgrade(db, schema.UPGRADES[:4])  # the schema before the route outcome was stored
    db.execute("INSERT INTO sessions (created_at, updated_at) VALUES (1, 1)")
    rows = [(1, "user", "", "local", ""), (2, "assistant", "small", "local", "local: short"),
            (3, "user", "", "local", ""), (4, "assistant", "gpt-big", "remote", "auto: rules: proof"),
            (5, "user", "", "local", ""), (6, "assistant", "small", "local", "fallback: remote failed (500)")]
    for seq, role, model, route, reason in rows:
        db.execute("INSERT INTO turns (session_id, seq, role, content, model, route, route_reason, created_at) "
                   "VALUES (1, ?, ?, 'text', ?, ?, ?, ?)", (seq, role, model, route, reason, seq))
    # A branch stored then holds turn rows without the new columns.
    db.execute("INSERT INTO branches (session_id, fork_seq, turns, created_at) VALUES (1, 6, ?, 0)",
               (json.dumps([{"seq": 6, "role": "assistant", "content": "older", "model": "small",
                             "timings": None, "route": "local", "route_reason": "", "finish_reason": "stop",
                             "stopped": 0, "created_at": 0}]),))
    db.close()

    with Store.open(path) as store:
        replies = store.replies()
        assert [(t.local_model, t.fell_back) for t in replies] == [
            ("small", False), ("small", False), ("small", True)]  # the remote one: the local before it
        [small] = model_stats(store)
        assert (small.model, small.routes.local, small.routes.escalated, small.routes.fallback) == (
            "small", 1, 1, 1)
        assert branches.switch(store, 1, 6, -1)
        assert [(t.content, t.local_model, t.fell_back) for t in store.turns(1)][-1] == ("older", "", False)


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
    assert "| 3 | 100 % | 0 % | 0 % |" in source  # every reply answered locally
    assert "a local share above ~90% can mean the router is too timid" in source
    line = next(row for row in source.splitlines() if row.startswith("TTFT "))
    assert len(line.split()[1]) == 3 and set(line.split()[1]) <= set("▁▂▃▄▅▆▇█")
