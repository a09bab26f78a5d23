"""bench's targets and printing over made-up reports, and the bare decode loop it measures each
turn against (with the real model)."""

from __future__ import annotations

from localchat.bench.decode import decode_against_raw, raw_decode_at_depth
from localchat.bench.report import lines, print_conversation
from localchat.bench.script import run_turn
from localchat.bench.targets import conversation_targets, restore_targets, typing_targets
from localchat.context.chat_context import ChatContext
from localchat.engine.options import Sampling
from localchat.events import Done, Timings


def turn(cache_n: int, prompt_n: int, n_ctx_used: int, ttft_ms: float) -> dict:
    return Timings(cache_n=cache_n, prompt_n=prompt_n, n_ctx_used=n_ctx_used, ttft_ms=ttft_ms,
                   prompt_ms=ttft_ms - 2, predicted_n=8).to_dict()


def conversation_report(engine_tpot_ms: float = 10.0) -> dict:
    turns = [Timings(tpot_ms=engine_tpot_ms, predicted_n=8), Timings(tpot_ms=engine_tpot_ms, predicted_n=8)]
    bare = [{"depth": 92, "tokens": 7, "raw_ms_per_token": 10.0},
            {"depth": 172, "tokens": 7, "raw_ms_per_token": 10.0}]
    return {"model": "m", "backend": "CPU", "n_ctx": 1024, "summary_max_tokens": 128,
            "turns": [turn(0, 60, 100, 50.0), turn(100, 40, 180, 30.0)],
            "summary": {"ttft_p50_ms": 40.0, "ttft_p95_ms": 49.0, "itl_p50_ms": 5.0, "itl_p95_ms": 7.0,
                        "tokens_per_second": 100.0, "reuse_pct": 50.0, "max_ttft_minus_prompt_ms": 2.0,
                        "median_ttft_minus_prompt_ms": 2.0},
            "raw_decode": decode_against_raw(turns, bare, Sampling(temperature=0, repeat_penalty=1.1))}


def test_a_conversation_that_reuses_its_cache_meets_its_targets():
    checks = {c["target"]: c for c in conversation_targets(conversation_report())}
    assert checks["turn k>=2: cache_n / tokens kept from the previous turn"]["value"] == 1.0
    assert all(c["ok"] for c in checks.values())


DECODE_TARGET = "decode speed / bare llama.cpp loop at each turn's depth (median)"


def test_a_slow_engine_misses_the_decode_speed_target():
    [check] = [c for c in conversation_targets(conversation_report(engine_tpot_ms=20.0))
               if c["target"] == DECODE_TARGET]
    assert (check["value"], check["limit"], check["ok"]) == (0.5, 0.95, False)


def test_each_turn_is_compared_with_the_bare_loop_at_its_depth_and_the_worst_is_kept():
    turns = [Timings(tpot_ms=10.0, predicted_n=8), Timings(tpot_ms=12.0, predicted_n=8),
             Timings(tpot_ms=11.0, predicted_n=8), Timings(predicted_n=1)]
    bare = [{"depth": 90, "tokens": 7, "raw_ms_per_token": 9.5}, None,
            {"depth": 300, "tokens": 7, "raw_ms_per_token": 8.8},
            {"depth": 400, "tokens": 1, "raw_ms_per_token": 9.0}]
    result = decode_against_raw(turns, bare, Sampling(temperature=0, repeat_penalty=1.1))
    # Turn 2 has no bare measurement (its memory could not drop cells), turn 4 no TPOT.
    assert [(r["turn"], r["depth"], r["decode_vs_raw"]) for r in result["turns"]] == [
        (1, 90, 0.95), (3, 300, 0.8)]
    assert (result["decode_vs_raw_median"], result["decode_vs_raw_min"]) == (0.875, 0.8)
    assert result["sampling"] == {"temperature": 0, "repeat_penalty": 1.1}


def test_no_measurable_turn_means_no_decode_target():
    report = conversation_report()
    report["raw_decode"] = decode_against_raw([Timings(tpot_ms=10.0, predicted_n=8)], [None], Sampling())
    assert report["raw_decode"]["decode_vs_raw_median"] is None
    assert DECODE_TARGET not in [c["target"] for c in conversation_targets(report)]


def test_a_restored_session_that_prefills_everything_misses_its_target():
    report = {"warm": {"prompt_n": 20}, "restored": {"prompt_n": 2000}, "restored_ttft_over_warm": 9.0}
    assert [c["ok"] for c in restore_targets(report)] == [False, False]


def test_a_paste_prefilled_while_typing_answers_within_twice_a_short_message():
    [check] = typing_targets(1.0, paste_ttft_ms=150.0, short_ttft_ms=100.0)
    assert (check["target"], check["value"], check["ok"]) == (
        "paste TTFT (1 s after the paste) / short TTFT", 1.5, True)
    assert not typing_targets(1.0, paste_ttft_ms=250.0, short_ttft_ms=100.0)[0]["ok"]


def test_the_timed_app_of_bench_tui_finds_the_apps_stylesheet():
    from pathlib import Path

    from localchat.bench.app import _TimedApp

    assert Path(_TimedApp.CSS_PATH).is_file()


def test_the_conversation_prints_a_row_per_turn_then_its_targets(capsys):
    report = conversation_report()
    report["targets"] = conversation_targets(report)
    print_conversation(report)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "model m · CPU · n_ctx 1024" and out[1].split()[:3] == ["turn", "cache_n", "prompt_n"]
    assert out[1].split()[5:8] == ["TPOT", "bare", "vs_bare"]
    assert out[3].split()[:3] == ["2", "100", "40"] and out[3].split()[6:8] == ["10.0", "1.000"]
    assert "median 1.0, min 1.0" in next(line for line in out if line.startswith("decode against"))
    assert out[-1].startswith(f"  [ok] {DECODE_TARGET}: 1.0")


def test_other_reports_print_as_indented_lines_with_timings_on_one_line():
    report = {"turns": 3, "warm": Timings(ttft_ms=12.5, prompt_n=4).to_dict(),
              "rules": {"precision": 0.9, "misrouted": [{"prompt": "x"}]}}
    assert lines(report) == ["turns: 3",
                             "warm: ttft_ms 12.5, prompt_n 4, cache_n 0, prompt_ms 0.0, restore_ms 0.0, tpot_ms 0.0",
                             "rules:", "  precision: 0.9", "  misrouted: 1 entries (see --json)"]


def _two_turns(engine, sampling, bare_loop: bool) -> tuple[list[int], Done, dict | None]:
    session = ChatContext(engine, sampling=sampling)
    first, _ = run_turn(session.send("Count to ten, please."))
    records = engine.cached_messages()
    bare = raw_decode_at_depth(engine, first.timings, first.finish_reason, sampling) if bare_loop else None
    assert engine.cached_messages() == records and engine.tokens_in_context == first.timings.n_ctx_used
    second, tokens = run_turn(session.send("Now count back down to one."))
    return tokens, second, bare


def test_the_bare_loop_runs_where_the_turn_decoded_and_leaves_its_cells_as_they_were(engine):
    sampling = Sampling(temperature=0, repeat_penalty=1.1, max_tokens=12)
    tokens, second, bare = _two_turns(engine, sampling, bare_loop=True)
    engine.reset()
    control_tokens, control, _ = _two_turns(engine, sampling, bare_loop=False)
    assert bare is not None and bare["raw_ms_per_token"] > 0
    # The first reply ran to max_tokens: its last token was sampled but never decoded.
    assert bare["tokens"] == 11 and bare["depth"] == second.timings.cache_n - 11
    assert tokens == control_tokens and second.timings.cache_n == control.timings.cache_n


def frames(p90: float, lag: float, growth: float | None = 1.1) -> dict:
    record = {"frames": 40, "frame_interval_p50_ms": p90 / 2, "frame_interval_p90_ms": p90,
              "frame_interval_max_ms": p90 * 2, "display_lag_p95_ms": lag,
              "frame_cpu_early_ms": 6.0, "frame_cpu_late_ms": None if growth is None else round(6.0 * growth, 1),
              "ui_core_percent": 8.5, "ui_cpu_per_token_ms": 0.9}
    if growth is not None:
        record["frame_cpu_late_over_early"] = growth
    return record


def tui_report() -> dict:
    return {"engine_alone_tokens_per_s": 80.0, "in_app_tokens_per_s": 77.6, "overhead_percent": 3.0,
            "keypress_p50_ms": 8.0, "keypress_p95_ms": 12.0, "keypress_max_ms": 14.0, "keypresses": 30,
            "frames": frames(90.0, 80.0, None),
            "one_thread": {"engine_alone_tokens_per_s": 50.0, "in_app_tokens_per_s": 49.0,
                           "overhead_percent": 2.0, "frames": frames(40.0, 30.0, None)},
            "shapes": {"one_paragraph": frames(95.0, 70.0), "many_blocks": frames(180.0, 250.0, 1.7)}}


def test_bench_tui_checks_frames_lag_and_flat_frame_cost_for_each_reply():
    from localchat.bench.targets import tui_targets

    checks = {c["target"]: c["ok"] for c in tui_targets(tui_report())}
    assert checks["decode in the app (headless) / engine alone"]
    assert checks["test model: frame interval p90 (ms)"] and checks["scripted one_paragraph: display lag p95 (ms)"]
    assert checks["llama.cpp on one thread: frame interval p90 (ms)"]
    assert not checks["scripted many_blocks: frame interval p90 (ms)"]
    assert not checks["scripted many_blocks: frame CPU at ~2,000 tokens / at ~100"]


def test_bench_tui_prints_a_row_of_frame_figures_per_reply(capsys):
    from localchat.bench.report import _FRAME_COLUMNS, print_tui
    from localchat.bench.targets import tui_targets

    report = tui_report()
    report["shapes"]["many_blocks_from_the_remote"] = frames(60.0, 90.0, 1.2)  # a long name
    report["targets"] = tui_targets(report)
    print_tui(report)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("decode: engine alone 80.0 tok/s, in the app 77.6 tok/s (overhead 3.0%)")
    header = next(line for line in out if line.startswith("frames of the reply"))
    table = [line for line in out if line.startswith(("test model", "scripted"))]
    assert {len(line) for line in table} == {len(header)}  # the columns line up under their titles
    width = len(header) - 11 * len(_FRAME_COLUMNS)
    rows = {line[:width].strip(): line[width:].split() for line in table}
    assert rows["scripted many_blocks"] == ["40", "90.0", "180.0", "360.0", "250.0", "6.0", "10.2", "1.7", "8.5",
                                            "0.9"]
    assert rows["test model"][6:8] == ["-", "-"]  # a 1,000-token reply has no frames 2,000 tokens in
    assert out[-1].startswith("  [") and "MISS" in "\n".join(out)


def test_the_frame_log_times_frames_lag_and_frame_cpu_early_and_late():
    from localchat.bench.frame_log import Frame, FrameLog

    log = FrameLog()
    # 2,400 tokens, one every 10 ms; a frame every 50 ms shows what came, painted 5 ms after it
    # ends; each frame costs 4 ms of CPU, those past 1,000 tokens 6 ms.
    log.emitted = [i * 0.01 for i in range(2400)]
    cpu = 0.0
    for n in range(1, 481):
        start = n * 0.05
        log.frames.append(Frame(start, start + 0.002, cpu, min(2400, int(start / 0.01) + 1)))
        log.paints.append(start + 0.007)
        cpu += 0.004 if n * 5 < 1000 else 0.006
    summary = log.summary()
    assert summary["frame_interval_p50_ms"] == summary["frame_interval_max_ms"] == 50.0
    assert summary["frame_cpu_early_ms"] == 4.0 and summary["frame_cpu_late_ms"] == 6.0
    assert summary["frame_cpu_late_over_early"] == 1.5
    # A token waits for the next frame (up to 40 ms after it came, here), then 7 ms for its paint.
    assert summary["display_lag_p95_ms"] == 47.0
    # From the first frame to the last: 199 frames of 4 ms and 280 of 6 ms in 479 × 50 ms, which
    # showed tokens 7 to 2,400.
    assert summary["ui_core_percent"] == round(100 * (199 * 4 + 280 * 6) / (479 * 50), 1) == 10.3
    assert summary["ui_cpu_per_token_ms"] == round((199 * 4 + 280 * 6) / 2394, 2)


def test_bench_pty_reads_the_echo_of_a_key_from_the_terminal(tmp_path):
    import os
    import subprocess

    from localchat.bench.pty_app import PtyReader, _bursts

    master, slave = os.openpty()
    process = subprocess.Popen(["cat"], stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    reader = PtyReader(master)
    os.write(master, b"q")
    echo = reader.wait_for(b"q", 0, 5.0)
    process.kill()
    process.wait()
    os.close(master)
    assert echo is not None
    assert _bursts([0.0, 0.001, 0.003, 0.1, 0.102, 0.5]) == [0.0, 0.1, 0.5]


async def test_bench_tuis_scripted_replies_stream_through_the_app_and_are_stored(store):
    # What bench --tui does with each reply shape, shortened: the scripted engine streams it
    # through the bench's timed app. An engine that drifts from the app's engine protocols fails
    # here (the app asks it for tokens, template overhead and its KV record on the way).
    import asyncio

    from localchat.bench import app as bench_app
    from localchat.bench.scripted_engine import many_blocks, one_paragraph, split_pieces

    for shape in (one_paragraph, many_blocks):
        text = shape(60)
        summary = await asyncio.wait_for(bench_app._shape(text, store, tpot_s=0.005), 60)
        assert summary["tokens"] == len(split_pieces(text))
        assert summary["frames"] >= 1
        turns = store.turns(store.last_session().id)
        assert [t.role for t in turns[-2:]] == ["user", "assistant"]
        assert turns[-1].content == text and turns[-1].finish_reason == "stop"
        assert turns[-1].timings.predicted_n == len(split_pieces(text))
    # Below a stored conversation: the turn continues that session.
    summary = await asyncio.wait_for(bench_app._shape(one_paragraph(60), store, tpot_s=0.005, below_turns=3), 60)
    assert summary["frames"] >= 1
    assert [t.role for t in store.turns(store.last_session().id)] == ["user", "assistant"] * 4


def test_bench_pty_drives_the_real_app_against_ask_and_compares_each_round(test_model_path):
    from localchat.bench.pty_app import measure_pty

    report = measure_pty(test_model_path, 24, rounds=1, terminal="pty")
    assert report["tokens"] == [24, 24]  # ask's reply, then the app's, both to max_tokens
    assert len(report["decode_ratio_per_round"]) == 1
    assert report["decode_ratio"] == report["decode_ratio_per_round"][0] > 0
    assert report["bytes_written_per_reply"] > 0
    assert {check["target"] for check in report["targets"]} >= {
        "decode in the app on a pty / engine alone (ask)"}
