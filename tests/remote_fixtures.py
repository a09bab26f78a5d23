"""Helpers and fixtures for the remote tests: a scripted local turn, settings for a loopback
server, and one real ``llama_cpp.server`` per test session.

Import the fixtures into a test module with ``from tests.remote_fixtures import llama_server``
(or move them into conftest.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from localchat.events import Done, Event, Timings, Token
from localchat.settings import parse_settings
from localchat.settings.remote import RemoteSettings


class ScriptedTurn:
    """A stand-in for the local engine's turn handle: yields the given tokens (with their
    probabilities), then ``Done``. After ``stop()`` it yields ``Done("aborted")`` with the text
    yielded so far, as the engine does."""

    def __init__(self, pieces: list[tuple[str, float | None] | Token], finish_reason: str = "stop",
                 context_full: bool = True) -> None:
        self.pieces = pieces
        self.finish_reason = finish_reason
        self.context_full = context_full
        self.stopped = threading.Event()

    def __iter__(self) -> Iterator[Event]:
        reply = []
        for piece in self.pieces:
            if self.stopped.is_set():
                break
            token = piece if isinstance(piece, Token) else Token(piece[0], prob=piece[1])
            reply.append(token.text)
            yield token
        finish = "aborted" if self.stopped.is_set() else self.finish_reason
        # A "length" reply here stands for one that ran out of context (the local model could
        # not say more); a cut at the user's max_tokens is modelled with a roomy context.
        n_ctx = 4096 if finish != "length" or not self.context_full else 64 + len(reply)
        yield Done("".join(reply), finish, Timings(predicted_n=len(reply), model="local-test",
                                                   n_ctx=n_ctx, n_ctx_used=64 + len(reply) - 1))

    def stop(self) -> None:
        self.stopped.set()


class LocalFactory:
    """Counts how often the orchestrator started a local reply, and returns ``ScriptedTurn``s."""

    def __init__(self, pieces: list[tuple[str, float | None] | Token], finish_reason: str = "stop",
                 context_full: bool = True) -> None:
        self.pieces = pieces
        self.finish_reason = finish_reason
        self.context_full = context_full
        self.turns: list[ScriptedTurn] = []

    def __call__(self) -> ScriptedTurn:
        turn = ScriptedTurn(self.pieces, self.finish_reason, self.context_full)
        self.turns.append(turn)
        return turn


def confident(word: str, n: int) -> list[tuple[str, float]]:
    """``n`` distinct tokens (``word0``, ``word1``…: no repetition loop) the model was sure of."""
    return [(f"{word}{i}", 0.9) for i in range(n)]


def unsure(word: str, n: int) -> list[Token]:
    """``n`` distinct tokens the model guessed (probability 0.001, entropy 5 nats, top-2 margin
    0.01); as the engine does, only the first 32 carry numbers."""
    return [Token(f"{word}{i}", prob=0.001 if i < 32 else None, margin=0.01 if i < 32 else None,
                  entropy=5.0 if i < 32 else None) for i in range(n)]


def hesitant(word: str, n: int, *, scored: int = 32) -> list[Token]:
    """``n`` distinct tokens of a model choosing between many continuations (entropy 4 nats,
    top-2 margin 0.02); as the engine does, only the first ``scored`` carry numbers."""
    return [Token(f"{word}{i}", prob=0.1 if i < scored else None,
                  margin=0.02 if i < scored else None, entropy=4.0 if i < scored else None)
            for i in range(n)]


def sure(word: str, n: int, *, scored: int = 32) -> list[Token]:
    """``n`` distinct tokens of a model sure of each (entropy 0.1 nats, margin 0.9)."""
    return [Token(f"{word}{i}", prob=0.95 if i < scored else None,
                  margin=0.9 if i < scored else None, entropy=0.1 if i < scored else None)
            for i in range(n)]


def text_of(pieces: list[tuple[str, float | None] | Token]) -> str:
    return "".join(p.text if isinstance(p, Token) else p[0] for p in pieces)


def settings_for(base_url: str, **overrides) -> RemoteSettings:
    """Settings pointing at a loopback server, mode auto, short timeouts."""
    section = {"mode": "auto", "base_url": base_url, "model": "", "timeout_s": 5.0, **overrides}
    return parse_settings({"remote": section}).remote


def events_of(turn) -> list[Event]:
    """All events of a turn (bounded: a turn that never ends fails the test by timeout)."""
    return list(turn)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition`` until true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def llama_server(test_model_path: Path, tmp_path_factory) -> Iterator[str]:
    """A real OpenAI-compatible server (llama_cpp.server) on loopback; yields its base URL
    (``http://127.0.0.1:PORT/v1``). One per test session: starting it costs a model load."""
    with _llama_cpp_server(test_model_path, tmp_path_factory) as (base_url, _):
        yield base_url


@dataclass(frozen=True)
class VisionServer:
    base_url: str
    log: Path  # the server's output: llama.cpp says there how it encoded each picture

    def pictures_encoded(self) -> int:
        return self.log.read_text(errors="replace").count("image slice encoded")


@pytest.fixture(scope="session")
def llama_vision_server(test_model_path: Path, tmp_path_factory) -> Iterator[VisionServer]:
    """``llama_server`` reading pictures: the test model with the synthetic ``mlp`` projector
    (tests/projector_fixture.py) through llama-cpp-python's LLaVA-1.5 chat handler, which takes
    OpenAI ``image_url`` parts."""
    from projector_fixture import write_mlp_projector

    projector = write_mlp_projector(tmp_path_factory.mktemp("projector") / "mmproj.gguf")
    with _llama_cpp_server(test_model_path, tmp_path_factory, "--clip_model_path",
                           str(projector), "--chat_format", "llava-1-5") as (base_url, log):
        yield VisionServer(base_url, log)


@contextmanager
def _llama_cpp_server(model: Path, tmp_path_factory, *extra: str) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
             "--n_threads", str(min(2, os.cpu_count() or 1)), *extra],
            stdout=log, stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_for_models(base_url, process, log_path)
        yield base_url, log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_for_models(base_url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llama_cpp.server exited: {log}")
        try:
            if httpx.get(f"{base_url}/models", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"llama_cpp.server did not answer within 60 s: {log_path}")
