"""``bench --tools``: its summary and targets from a round's numbers, and the bench's MCP server
answering as a real one (the whole mode runs the model: the lead's bench run, not the suite)."""

from __future__ import annotations

import sys
from pathlib import Path

from localchat.bench.tools import _mcp_json, _summary, _targets
from localchat.settings import Settings
from localchat.tools.registry import ToolRegistry


def round_row(**changes):
    row = {"call_ttft_ms": 50.0, "cache_before": 800, "cache_n": 800, "prompt_n": 31,
           "result_n": 8, "header_n": 23, "reuse": 1.0, "call_end_to_tool_start_ms": 3.0,
           "tool_ms": 9.0, "result_to_prefill_start_ms": 5.0}
    return {**row, **changes}


def test_targets_hold_for_good_numbers_and_name_each_miss():
    rows = {"none": [{"ttft_ms": 100.0, "prompt_n": 114, "tools_offered": 0}],
            "starting": [{"ttft_ms": 105.0, "prompt_n": 114, "tools_offered": 0}],
            "up": [{"ttft_ms": 400.0, "prompt_n": 863, "tools_offered": 9}],
            "none_second": [{"ttft_ms": 100.0, "prompt_n": 120, "tools_offered": 0}],
            "up_second": [{"ttft_ms": 104.0, "prompt_n": 120, "tools_offered": 9}],
            "none_typed": [{"ttft_ms": 30.0, "prompt_n": 4, "tools_offered": 0}],
            "up_typed": [{"ttft_ms": 32.0, "prompt_n": 4, "tools_offered": 9}],
            "round": [round_row()]}
    assert all(check["ok"] for check in _targets(_summary(rows)))
    rows["up_second"] = [{"ttft_ms": 150.0, "prompt_n": 120, "tools_offered": 9}]
    rows["up_typed"] = [{"ttft_ms": 300.0, "prompt_n": 700, "tools_offered": 9}]
    rows["round"] = [round_row(reuse=0.5, result_to_prefill_start_ms=40.0)]
    missed = [check["target"] for check in _targets(_summary(rows)) if not check["ok"]]
    assert len(missed) == 4 and sum("TTFT" in m for m in missed) == 2
    assert any("cache_n" in m for m in missed) and any("prefill start" in m for m in missed)


def test_the_bench_servers_start_and_answer(tmp_path: Path):
    with ToolRegistry.from_config(Settings(), _mcp_json(tmp_path)) as registry:
        assert registry.wait_started(60)
        names = {tool.exposed for tool in registry.tools()}
        assert {"alpha_echo", "beta_add", "gamma_word_count"} <= names
        assert sys.executable in (tmp_path / "mcp.json").read_text()
