"""``localchat bench --restore``: how fast a long session answers after it is reopened.

Builds a ~2,000-token session through the same store and snapshots the app and ``ask --session``
use, copies it, and then asks the same next question three ways, all in one run:

- warm: in this process, which never closed the session (the reference);
- restored: ``localchat ask --session`` in a new process, which restores the KV snapshot;
- rebuilt: a new process with no snapshot, which must prefill the whole conversation.

Everything happens under a temporary LOCALCHAT_HOME, so the user's sessions are never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from localchat.bench.script import DEFAULT_QUESTIONS, DEFAULT_SYSTEM, run_turn
from localchat.bench.targets import restore_targets
from localchat.engine.options import Sampling
from localchat.errors import UserError
from localchat.settings import Settings
from localchat.store import SessionRecord, Store

NEXT_QUESTION = "Please remind me, in one sentence, what my very first question was about."


def measure_restore(model_path: Path, n_ctx: int, target_tokens: int = 2000,
                    max_tokens: int = 48) -> dict[str, Any]:
    """See the module docstring; the report, its targets checked. Takes three long prefills."""
    # Default settings on both sides, so the new process computes the same fingerprint.
    config = Settings()
    saved_home = os.environ.get("LOCALCHAT_HOME")
    with tempfile.TemporaryDirectory(prefix="localchat-bench-") as home:
        os.environ["LOCALCHAT_HOME"] = home
        try:
            report = _measure(model_path, config, n_ctx, target_tokens, max_tokens)
            report["targets"] = restore_targets(report)
            return report
        finally:
            if saved_home is None:
                os.environ.pop("LOCALCHAT_HOME", None)
            else:
                os.environ["LOCALCHAT_HOME"] = saved_home


def _measure(model_path: Path, config: Settings, n_ctx: int, target_tokens: int,
             max_tokens: int) -> dict[str, Any]:
    from localchat import paths
    from localchat.chat.snapshots import SessionSnapshots
    from localchat.context.factory import open_chat
    from localchat.engine.factory import open_engine
    from localchat.engine.snapshot_file import SnapshotStore

    if n_ctx < target_tokens + 2 * max_tokens + 200:
        raise UserError(f"--restore needs --n-ctx of at least {target_tokens + 2 * max_tokens + 200}")
    engine = open_engine(str(model_path), config, n_ctx=n_ctx)
    engine.load()
    store = Store.open()
    snapshots = SessionSnapshots(SnapshotStore(paths.snapshots_dir()))
    greedy = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=max_tokens)
    try:
        warm_session = store.create_session("restore-warm", system=DEFAULT_SYSTEM)
        chat = open_chat(engine, config, system=DEFAULT_SYSTEM, sampling=greedy)
        turn = 0
        while engine.tokens_in_context < target_tokens:
            question = DEFAULT_QUESTIONS[turn % len(DEFAULT_QUESTIONS)]
            store.add_user_turn(warm_session.id, question)
            done, _ = run_turn(chat.send(question))
            store.add_reply(warm_session.id, done.reply, model=engine.name, timings=done.timings)
            turn += 1
        context_tokens = engine.tokens_in_context
        started = time.perf_counter()
        snapshots.save(warm_session.id, engine, chat)  # what blocks the engine: the copy out
        export_ms = (time.perf_counter() - started) * 1000.0
        snapshots.flush()
        write_ms = (time.perf_counter() - started) * 1000.0 - export_ms
        restored_session = _copy_session(store, warm_session.id, "restore-new-process")
        _copy_session(store, warm_session.id, "restore-rebuild")  # no snapshot: must prefill
        saved = snapshots.store.load(snapshots.key(warm_session.id), engine.fingerprint())
        if saved is None:  # the write failed (a full disk): nothing to restore from
            raise UserError(snapshots.store.take_notice() or "the session's context was not saved")
        snapshots.store.save(snapshots.key(restored_session.id), engine.fingerprint(),
                             saved.snapshot, saved.meta)
        warm, _ = run_turn(chat.send(NEXT_QUESTION))
    finally:
        engine.close()
        store.close()
    restored = _ask_in_new_process(model_path, "restore-new-process", n_ctx, max_tokens)
    rebuilt = _ask_in_new_process(model_path, "restore-rebuild", n_ctx, max_tokens)
    warm_t = warm.timings.to_dict()
    return {
        "context_tokens": context_tokens,
        "turns": turn,
        "snapshot_bytes": len(saved.snapshot.state),
        "snapshot_export_ms": round(export_ms, 1),  # engine thread busy (delays a turn sent now)
        "snapshot_write_ms": round(write_ms, 1),  # on a writer thread
        "warm": warm_t,
        "restored": restored,
        "rebuilt": rebuilt,
        "restored_ttft_over_warm": round(restored["ttft_ms"] / warm_t["ttft_ms"], 2),
        "rebuilt_ttft_over_warm": round(rebuilt["ttft_ms"] / warm_t["ttft_ms"], 2),
    }


def _copy_session(store: Store, session_id: int, name: str) -> SessionRecord:
    source = store.session(session_id)
    copy = store.create_session(name, system=source.system)
    for turn in store.turns(session_id):
        if turn.role == "user":
            store.add_user_turn(copy.id, turn.content)
        else:
            store.add_reply(copy.id, turn.content, model=turn.model, timings=turn.timings)
    return copy


def _ask_in_new_process(model_path: Path, session: str, n_ctx: int, max_tokens: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "localchat", "ask", "--json", "--session", session,
               "--model", str(model_path), "--n-ctx", str(n_ctx), "--temperature", "0",
               "--max-tokens", str(max_tokens), NEXT_QUESTION]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    done = next((e for e in events if e["event"] == "done"), None)
    if result.returncode != 0 or done is None:
        raise UserError(f"the new-process turn failed: {result.stderr.strip()[-300:]}")
    return done["timings"]
