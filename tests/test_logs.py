"""Unexpected failures: one line for the user, the traceback in a size-capped log file."""

from __future__ import annotations

import logging

from localchat import logs, paths
from localchat.engine.engine import Engine
from localchat.events import Failed


def test_a_fault_on_the_engine_thread_is_one_line_and_its_traceback_goes_to_the_log(tmp_path):
    engine = Engine(tmp_path / "never-loaded.gguf")

    def broken_turn(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected fault")

    engine._turn = broken_turn  # type: ignore[method-assign]
    try:
        final = engine.submit([{"role": "user", "content": "hi"}]).wait(timeout=30)
    finally:
        engine.close()

    assert isinstance(final, Failed)
    assert "\n" not in final.message and "RuntimeError: injected fault" in final.message
    assert str(paths.log_file()) in final.message  # where to look
    logged = paths.log_file().read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in logged
    assert "in broken_turn" in logged and "RuntimeError: injected fault" in logged


def test_the_log_file_cannot_grow_without_bound(monkeypatch):
    monkeypatch.setattr(logs, "MAX_BYTES", 4000)
    path = logs.attach()
    assert path == paths.log_file()
    log = logging.getLogger("localchat.test")
    for i in range(200):
        log.warning("line %d %s", i, "x" * 100)

    files = sorted(path.parent.glob("localchat.log*"))
    assert [f.name for f in files] == ["localchat.log", "localchat.log.1", "localchat.log.2"]
    assert all(f.stat().st_size <= 4000 for f in files)
