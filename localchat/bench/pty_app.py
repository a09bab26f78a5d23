"""The real app on a pseudo-terminal: decode speed through it against the engine alone, keypress
latency and how often the terminal's screen changes, with what writing to a terminal costs.

The headless bench skips the terminal: Textual's escape sequences are never made nor written,
and no terminal parses them. Here ``localchat`` runs as the user starts it, on a pty of 120×40
(``terminal="tmux"``: inside tmux on that pty, so that a terminal emulator parses every byte on
this machine, as in the issue's measurements), with a scratch home whose config makes replies
greedy. Each round runs ``localchat ask --json`` (the engine with no UI: the reference) and then
the app, which gets the same prompt; the app's reply timings are read from its store. While the
reply streams a key is typed every 0.25 s and timed from the write to the first output that
echoes it; the output's bursts (writes less than 5 ms apart) are the screen updates.

``localchat bench --tui --pty [tmux]`` prints this.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

from localchat.bench.targets import pty_targets
from localchat.errors import UserError
from localchat.percentiles import percentile
from localchat.store import Store

PROMPT = "Write all the numbers from 1 to 1000, separated by commas. Do not stop early."
SIZE = (120, 40)
KEY = b"q"  # not in the reply (numbers), the status bar or the footer: its echo is the key's
KEYPRESS_INTERVAL_S = 0.25
BURST_GAP_S = 0.005
START_TIMEOUT_S = 120.0


class PtyReader:
    """Everything the program on the pty's other side writes, timestamped, read on a thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.chunks: list[tuple[float, bytes]] = []
        self._seen = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True, name="pty-reader")
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            with self._seen:
                if not data:
                    self.chunks.append((time.perf_counter(), b""))
                    self._seen.notify_all()
                    return
                self.chunks.append((time.perf_counter(), data))
                self._seen.notify_all()

    def wait_for(self, needle: bytes, since: int, timeout: float) -> tuple[int, float] | None:
        """(chunk index, time) of the first chunk from ``since`` on containing ``needle``."""
        deadline = time.perf_counter() + timeout
        with self._seen:
            while True:
                for index in range(since, len(self.chunks)):
                    at, data = self.chunks[index]
                    if needle in data:
                        return index, at
                    if not data:
                        return None
                since = len(self.chunks)
                left = deadline - time.perf_counter()
                if left <= 0 or not self._seen.wait(left):
                    return None


def _write_config(home: Path, n_tokens: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"[sampling]\ntemperature = 0\nmax_tokens = {n_tokens}\nseed = 0\n\n[engine]\nn_ctx = 2048\n")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "NO_COLOR")}
    return {**env, "LOCALCHAT_HOME": str(home), "TERM": "xterm-256color"}


def _engine_alone(model: Path, home: Path) -> dict[str, Any]:
    """``localchat ask --json``: the same greedy reply with no UI (stdout is a pipe)."""
    result = subprocess.run([sys.executable, "-m", "localchat", "ask", "--model", str(model), "--json", PROMPT],
                            capture_output=True, text=True, env=_env(home), timeout=900)
    if result.returncode != 0:
        raise UserError(f"localchat ask failed: {result.stderr.strip().splitlines()[-1:]}")
    done = next(json.loads(line) for line in reversed(result.stdout.splitlines()) if '"done"' in line)
    return done["timings"]


def _app_command(model: Path, terminal: str) -> list[str]:
    app = [sys.executable, "-m", "localchat", "--model", str(model)]
    if terminal != "tmux":
        return app
    width, height = SIZE
    return ["tmux", "-L", f"localchat-bench-{os.getpid()}", "-f", "/dev/null", "new-session",
            "-x", str(width), "-y", str(height), " ".join(_quote(a) for a in app), ";",
            "set-option", "-g", "status", "off"]


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _through_app(model: Path, home: Path, terminal: str) -> dict[str, Any]:
    master, slave = os.openpty()
    width, height = SIZE
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
    process = subprocess.Popen(_app_command(model, terminal), stdin=slave, stdout=slave, stderr=slave,
                               env=_env(home), start_new_session=True, close_fds=True)
    os.close(slave)
    reader = PtyReader(master)
    try:
        return _drive(reader, master, home)
    finally:
        os.write(master, b"\x11")  # Ctrl+Q
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if terminal == "tmux":
            subprocess.run(["tmux", "-L", f"localchat-bench-{os.getpid()}", "kill-server"],
                           capture_output=True)
        os.close(master)


def _drive(reader: PtyReader, master: int, home: Path) -> dict[str, Any]:
    if reader.wait_for(b"idle", 0, START_TIMEOUT_S) is None:
        raise UserError("the app did not become ready on the pty (no 'idle' in the status bar)")
    time.sleep(0.5)
    os.write(master, PROMPT.encode() + b"\r")
    sent_at = time.perf_counter()
    latencies: list[float] = []
    with Store.open(home / "data" / "sessions.db") as store:
        def answered() -> Any:
            session = store.last_session()
            turns = store.turns(session.id) if session else []
            return turns[-1] if turns and turns[-1].role == "assistant" else None

        reply = None
        time.sleep(1.0)  # past the first token
        while (reply := answered()) is None:
            if time.perf_counter() - sent_at > 900:
                raise UserError("the app on the pty did not finish its reply")
            since = len(reader.chunks)
            pressed_at = time.perf_counter()
            os.write(master, KEY)
            echo = reader.wait_for(KEY, since, 1.0)
            if echo is not None:
                latencies.append((echo[1] - pressed_at) * 1000)
            time.sleep(max(0.0, KEYPRESS_INTERVAL_S - (time.perf_counter() - pressed_at)))
    streamed = [at for at, data in reader.chunks if sent_at < at and data]
    return {"timings": reply.timings, "keypress_ms": latencies, "updates": _bursts(streamed),
            "bytes": sum(len(data) for at, data in reader.chunks if sent_at < at)}


def _bursts(times: list[float]) -> list[float]:
    """Starts of the runs of writes that are less than BURST_GAP_S apart."""
    starts: list[float] = []
    last = None
    for at in times:
        if last is None or at - last > BURST_GAP_S:
            starts.append(at)
        last = at
    return starts


def measure_pty(model_path: Path, n_tokens: int = 400, *, rounds: int = 2, terminal: str = "pty") -> dict[str, Any]:
    """Alternating ``rounds`` × (``ask``, the app on a pty): tokens/s of each, their ratio, keypress
    latency and the intervals between screen updates, with targets. The ratio is the median of
    each round's (the app against the ``ask`` run just before it): on a shared machine the speed
    of both drifts by tens of per cent from one minute to the next."""
    if terminal == "tmux" and shutil.which("tmux") is None:
        raise UserError("--pty tmux needs tmux on PATH")
    alone, in_app, keys, intervals, written = [], [], [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        _write_config(home, n_tokens)
        for _ in range(rounds):
            alone.append(_engine_alone(model_path, home))
            run = _through_app(model_path, home, terminal)
            in_app.append(run["timings"])
            keys += run["keypress_ms"]
            updates = run["updates"]
            intervals += [(b - a) * 1000 for a, b in zip(updates, updates[1:]) if b - a < 1.5]
            written.append(run["bytes"])
    alone_tps = statistics.mean(t["predicted_per_second"] for t in alone)
    app_tps = statistics.mean(t.predicted_per_second for t in in_app)
    ratios = [app.predicted_per_second / ask["predicted_per_second"]
              for ask, app in zip(alone, in_app) if ask["predicted_per_second"]]
    ordered = sorted(keys)
    report: dict[str, Any] = {
        "terminal": terminal,
        "size": f"{SIZE[0]}x{SIZE[1]}",
        "tokens": [t["predicted_n"] for t in alone] + [t.predicted_n for t in in_app],
        "engine_alone_tokens_per_s": round(alone_tps, 2),
        "in_app_tokens_per_s": round(app_tps, 2),
        "decode_ratio": round(statistics.median(ratios), 3) if ratios else 0.0,
        "decode_ratio_per_round": [round(r, 3) for r in ratios],
        "engine_alone_tpot_ms": round(statistics.mean(t["tpot_ms"] for t in alone), 2),
        "in_app_tpot_ms": round(statistics.mean(t.tpot_ms for t in in_app), 2),
        "keypresses": len(ordered),
        "keypress_p50_ms": round(statistics.median(ordered), 1) if ordered else None,
        "keypress_p95_ms": round(percentile(ordered, 95), 1) if ordered else None,
        "keypress_max_ms": round(ordered[-1], 1) if ordered else None,
        "screen_updates": len(intervals) + len(in_app),
        "frame_interval_p50_ms": round(percentile(intervals, 50), 1) if intervals else None,
        "frame_interval_p90_ms": round(percentile(intervals, 90), 1) if intervals else None,
        "frame_interval_max_ms": round(max(intervals), 1) if intervals else None,
        "bytes_written_per_reply": int(statistics.mean(written)),
    }
    report["targets"] = pty_targets(report)
    return report
