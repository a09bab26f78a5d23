"""``localchat bench --tools``: issue 40's targets for tools, on one model file and three real MCP
servers (``bench.mcp_bench_server`` over stdio, three processes, as a user's mcp.json starts them).

Each round, greedily, on an emptied cache each time:

- **none**: a message with no tools configured; its TTFT;
- **three, starting**: the same message sent the moment three MCP servers were configured and
  started (the app's state just after it opens): it does not wait for them (it is sent with the
  tools already up: none yet). Their start-up (each an interpreter importing the MCP SDK, seconds
  of CPU) runs beside the prefill, and on a machine with few cores that is what it costs;
- **three, up**: the same message once the servers are up: its prompt carries their tools'
  descriptions (a longer prefill, shown with its prompt tokens: the tools must be described);
- **typed** (the app's first message): the same message with none configured and with the three
  servers up, prefilled while it was typed as the app does (``ChatContext.draft_messages`` with
  the tools the message will offer, then sent): the tools' descriptions are in the cache before
  the message is sent, so its TTFT is within 1.1x of none's;
- **a conversation's message** (the target): the same message as the second of a conversation,
  with none configured and with the three servers up: the tools' descriptions came with the
  first message and stay cached, so its TTFT is within 1.1x of none's;
- **a tool round**: the message forces a call (``tool_choice`` = one server's ``echo``), the
  call runs (allowed), its result goes back and the model replies. Measured: the reply after the
  result reuses the whole cache from before it (``cache_n`` / tokens in the cache when the call
  ended: 1.0) and prefills only the result and the next header (``prompt_n`` - the result's
  tokens = the header); from the call's last token (the last event of the calling reply read) to
  the tool's start, and from its result to the next prefill's start (the prefill's end as read,
  less its own ``prompt_ms``): at most 20 ms each.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from localchat.bench.targets import target
from localchat.chat.tool_rounds import ToolTurn, start
from localchat.chat.tools import ChatTools
from localchat.context.chat_context import ChatContext
from localchat.engine.engine import Engine
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Done, Failed, PrefillProgress, Token, ToolCalled, ToolReturned, Turn
from localchat.settings import Settings

SERVERS = ("alpha", "beta", "gamma")
TTFT_RATIO_LIMIT = 1.1
GAP_LIMIT_MS = 20.0
CALL_TOKENS = 96
PROMPT = ("A lighthouse keeper on a small island keeps a logbook of every ship that passes, the "
          "weather each morning and evening, and the birds that rest on the gallery rail. Over "
          "one winter the entries grow shorter while the storms grow longer, and in spring a "
          "supply boat brings a letter that changes the keeper's plans. Write the first "
          "paragraph of that logbook for the first of March, in the keeper's plain voice.")
CALL_PROMPT = "Use the echo tool to repeat the word lighthouse."
FIRST_MESSAGE = "Hello! I have a writing task for you."


def measure_tools(model_path: Path, model_name: str, *, n_ctx: int, max_tokens: int,
                  rounds: int, say: Callable[[str], None]) -> dict[str, Any]:
    """The report ``--json`` prints, its targets checked (see the module docstring)."""
    sampling = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=max_tokens)
    engine = Engine(model_path, EngineOptions(n_ctx=n_ctx, speculative="off"), name=model_name)
    say(f"loading {model_name}")
    info = engine.load()
    rows: dict[str, list[dict[str, Any]]] = {
        "none": [], "starting": [], "up": [], "none_second": [], "up_second": [],
        "none_typed": [], "up_typed": [], "round": []}
    try:
        with tempfile.TemporaryDirectory(prefix="localchat-bench-tools-") as folder:
            mcp_path = _mcp_json(Path(folder))
            config = Settings()
            for index in range(rounds):
                say(f"round {index + 1}/{rounds}")
                rows["none"].append(_answer(engine, PROMPT, ChatTools.empty(), sampling))
                rows["none_second"].append(_answer(engine, PROMPT, ChatTools.empty(), sampling,
                                                   after=FIRST_MESSAGE))
                rows["none_typed"].append(_answer(engine, PROMPT, ChatTools.empty(), sampling,
                                                  typed=True))
                tools = ChatTools.open(config, ("*",), mcp_path=mcp_path)
                try:
                    rows["starting"].append(_answer(engine, PROMPT, tools, sampling))
                    if not tools.registry.wait_started(60):
                        raise RuntimeError("the bench's MCP servers did not start within 60 s")
                    rows["up"].append(_answer(engine, PROMPT, tools, sampling))
                    rows["up_second"].append(_answer(engine, PROMPT, tools, sampling,
                                                     after=FIRST_MESSAGE))
                    rows["up_typed"].append(_answer(engine, PROMPT, tools, sampling, typed=True))
                    rows["round"].append(_tool_round(engine, tools, sampling))
                finally:
                    tools.close()
    finally:
        engine.close()
    summary = _summary(rows)
    return {"mode": "tools", "model": model_name, "backend": info.backend, "n_ctx": n_ctx,
            "max_tokens": max_tokens, "rounds": rounds, "servers": len(SERVERS), **rows,
            "summary": summary, "targets": _targets(summary)}


def _mcp_json(folder: Path) -> Path:
    path = folder / "mcp.json"
    command = {"command": sys.executable, "args": ["-m", "localchat.bench.mcp_bench_server"]}
    path.write_text(json.dumps({"mcpServers": dict.fromkeys(SERVERS, command)}))
    return path


def _answer(engine: Engine, prompt: str, tools: ChatTools, sampling: Sampling, *,
            after: str = "", typed: bool = False) -> dict[str, Any]:
    """One message on an emptied cache (``after``: sent as the second message, after this one;
    ``typed``: prefilled while typed, as the app does, before it is sent)."""
    engine.reset()
    chat = ChatContext(engine, sampling=sampling)
    chat.next_tools = lambda: tools.offer(sampling).tools
    if after:
        _final(start(chat, after, tools))
    if typed:
        messages = chat.draft_messages(prompt)
        if messages is not None:
            engine.prepare(messages, chat.tools_for_prefill()).wait()
    turn = start(chat, prompt, tools)
    offered = len(turn.sampling.tools) if isinstance(turn, ToolTurn) else 0
    done = _final(turn)
    t = done.timings
    return {"ttft_ms": round(t.ttft_ms, 1), "prompt_n": t.prompt_n, "tools_offered": offered}


def _final(turn: Turn) -> Done:
    final = None
    for event in turn:
        final = event
    if not isinstance(final, Done):
        message = final.message if isinstance(final, Failed) else "no final event"
        raise RuntimeError(f"the bench's turn failed: {message}")
    return final


def _tool_round(engine: Engine, tools: ChatTools, sampling: Sampling) -> dict[str, Any]:
    engine.reset()
    chat = ChatContext(engine, sampling=sampling)
    # Room for the call (its markup and JSON) whatever the answers' max_tokens.
    calling = replace(sampling, max_tokens=max(sampling.max_tokens, CALL_TOKENS))
    turn = start(chat, CALL_PROMPT, tools, calling, tool_choice=f"{SERVERS[0]}_echo")
    assert isinstance(turn, ToolTurn)
    last_read: float | None = None  # the calling reply's last event, as read
    prefilled: float | None = None  # the next reply's prefill end, as read
    stage = "calling"
    result_text = ""
    for event in turn:
        now = time.perf_counter()
        if stage == "calling" and isinstance(event, (Token, PrefillProgress)):
            last_read = now
        elif isinstance(event, ToolCalled):
            stage = "running"
        elif isinstance(event, ToolReturned):
            stage, result_text = "answering", event.result.content
        elif stage == "answering" and isinstance(event, PrefillProgress) \
                and event.done == event.total and prefilled is None:
            prefilled = now
    final = turn.result
    if not isinstance(final, Done) or "tool_start" not in turn.marks or not turn.rounds \
            or turn.rounds[0].done is None:
        calls = turn.rounds[0].done.tool_calls if turn.rounds and turn.rounds[0].done else ()
        raise RuntimeError(f"the bench's tool round did not run a call: {calls or final}")
    first = turn.rounds[0].done.timings
    marks = turn.marks
    call_end = last_read if last_read is not None else marks["reply_end"][0]
    after = final.timings
    prefill_start = (prefilled - after.prompt_ms / 1000.0) if prefilled is not None else None
    result_n = engine.count_tokens(result_text)
    return {
        "call_ttft_ms": round(first.ttft_ms, 1),
        "cache_before": first.n_ctx_used, "cache_n": after.cache_n, "prompt_n": after.prompt_n,
        "result_n": result_n, "header_n": after.prompt_n - result_n,
        "reuse": round(after.cache_n / first.n_ctx_used, 4) if first.n_ctx_used else None,
        "call_end_to_tool_start_ms": round((marks["tool_start"][0] - call_end) * 1000.0, 2),
        "tool_ms": round((marks["tool_end"][0] - marks["tool_start"][0]) * 1000.0, 2),
        "result_to_prefill_start_ms": (round((prefill_start - marks["tool_end"][0]) * 1000.0, 2)
                                       if prefill_start is not None else None),
    }


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _summary(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    none, starting, up, none_second, up_second, none_typed, up_typed = (
        _median(rows[k], "ttft_ms") for k in ("none", "starting", "up", "none_second", "up_second",
                                              "none_typed", "up_typed"))
    return {
        "ttft_typed_none_ms": none_typed, "ttft_typed_three_up_ms": up_typed,
        "ttft_typed_up_over_none": _ratio(up_typed, none_typed),
        "ttft_none_ms": none, "ttft_three_starting_ms": starting, "ttft_three_up_ms": up,
        "ttft_starting_over_none": _ratio(starting, none),
        "ttft_up_over_none": _ratio(up, none),
        "ttft_second_none_ms": none_second, "ttft_second_three_up_ms": up_second,
        "ttft_second_up_over_none": _ratio(up_second, none_second),
        "prompt_n_second_up": _median(rows["up_second"], "prompt_n"),
        "tools_offered_starting": max((r["tools_offered"] for r in rows["starting"]), default=0),
        "tools_offered_up": max((r["tools_offered"] for r in rows["up"]), default=0),
        "prompt_n_none": _median(rows["none"], "prompt_n"),
        "prompt_n_up": _median(rows["up"], "prompt_n"),
        "reuse_min": min((r["reuse"] for r in rows["round"] if r["reuse"] is not None),
                         default=None),
        "header_n_max": max((r["header_n"] for r in rows["round"]), default=None),
        "call_end_to_tool_start_ms": _median(rows["round"], "call_end_to_tool_start_ms"),
        "result_to_prefill_start_ms": _median(rows["round"], "result_to_prefill_start_ms"),
        "call_end_to_tool_start_max_ms": max((r["call_end_to_tool_start_ms"]
                                              for r in rows["round"]), default=None),
    }


def _targets(s: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    ratio = s["ttft_typed_up_over_none"]
    checks.append(target("TTFT of the first message typed in the app with three MCP servers up / "
                         "with none (medians)", ratio, TTFT_RATIO_LIMIT,
                         ratio is not None and ratio <= TTFT_RATIO_LIMIT))
    ratio = s["ttft_second_up_over_none"]
    checks.append(target("TTFT of a conversation's message with three MCP servers up / with "
                         "none (medians)", ratio, TTFT_RATIO_LIMIT,
                         ratio is not None and ratio <= TTFT_RATIO_LIMIT))
    reuse = s["reuse_min"]
    checks.append(target("after a tool result: cache_n / tokens cached when the call ended (min)",
                         reuse, 1.0, reuse is not None and reuse >= 1.0))
    for key, name in (("call_end_to_tool_start_ms", "call's last token -> tool start (ms, median)"),
                      ("result_to_prefill_start_ms", "result -> next prefill start (ms, median)")):
        value = s[key]
        checks.append(target(name, value, GAP_LIMIT_MS, value is not None and value <= GAP_LIMIT_MS))
    return checks


def print_tools(report: dict[str, Any]) -> None:
    """The report as a few lines: the TTFTs, the tool round, the targets."""
    s = report["summary"]
    print(f"model {report['model']} · {report['backend']} · n_ctx {report['n_ctx']} · greedy, "
          f"max_tokens {report['max_tokens']} · {report['rounds']} rounds (medians) · "
          f"{report['servers']} MCP servers over stdio")
    print(f"TTFT, no tools configured:         {s['ttft_none_ms']} ms "
          f"(prompt {s['prompt_n_none']} tok)")
    print(f"TTFT, three servers just started:  {s['ttft_three_starting_ms']} ms "
          f"({s['tools_offered_starting']} tools offered: the message did not wait)")
    print(f"TTFT, three servers up:            {s['ttft_three_up_ms']} ms "
          f"(prompt {s['prompt_n_up']} tok: {s['tools_offered_up']} tools described)")
    print(f"first message / none: just started {s['ttft_starting_over_none']}x, up "
          f"{s['ttft_up_over_none']}x")
    print(f"TTFT of a first message prefilled while typed (as the app does): none "
          f"{s['ttft_typed_none_ms']} ms, three servers up {s['ttft_typed_three_up_ms']} ms = "
          f"{s['ttft_typed_up_over_none']}x")
    print(f"TTFT of a second message: none {s['ttft_second_none_ms']} ms, three servers up "
          f"{s['ttft_second_three_up_ms']} ms (prompt {s['prompt_n_second_up']} tok: the tools "
          f"stay cached) = {s['ttft_second_up_over_none']}x")
    for row in report["round"]:
        print(f"tool round: cache {row['cache_n']}/{row['cache_before']} reused, prefill "
              f"{row['prompt_n']} tok = result {row['result_n']} + header {row['header_n']}; "
              f"call end -> tool start {row['call_end_to_tool_start_ms']} ms, tool ran "
              f"{row['tool_ms']} ms, result -> prefill start {row['result_to_prefill_start_ms']} ms")
    for check in report["targets"]:
        mark = "ok" if check["ok"] else "MISS"
        print(f"[{mark}] {check['target']}: {check['value']} (limit {check['limit']})")
