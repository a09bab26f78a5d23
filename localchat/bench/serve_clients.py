"""What ``bench --serve`` drives: OpenAI-compatible servers (``localchat serve`` and
llama-cpp-python's server started here, any other at a URL) and one streamed request timed as a
client sees it.

``stream_chat`` sends one ``/v1/chat/completions`` request (``stream_completion`` one
``/v1/completions`` request, a prompt continued) with ``stream: true`` and ``include_usage`` and
reads the SSE stream: TTFT is the time from sending to the first chunk with text (answer or
reasoning), decode speed the text chunks after the first over the time they took, and the cached
tokens come from ``usage.prompt_tokens_details.cached_tokens`` or llama-server's
``timings.cache_n`` (None when the server reports neither). ``stream_infill`` sends one
llama-server ``/infill`` request (fill-in-the-middle, in llama-server's own event shape): TTFT is
the time to its first event (a token, with text or none: a fill may be empty), the prompt tokens
evaluated and cached come from its last (``timings.prompt_n``, ``timings.cache_n``). A refused
request keeps its HTTP status (``Answer.status``): a server without an endpoint answers 404 or 501.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from localchat.errors import UserError


@dataclass
class Answer:
    """One streamed request as the client saw it."""

    text: str = ""
    ttft_ms: float | None = None
    decode_tps: float | None = None  # text chunks per second after the first
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prefilled_tokens: int | None = None  # prompt tokens this request evaluated (timings.prompt_n)
    finish_reason: str | None = None
    done: bool = False  # data: [DONE] arrived
    error: str | None = None
    status: int | None = None  # the HTTP status (None: no answer at all)
    ended_at: float = 0.0

    @property
    def complete(self) -> bool:
        return self.done and self.finish_reason in ("stop", "length") and self.error is None


def chat_body(model: str, messages: list[dict], max_tokens: int) -> dict[str, Any]:
    """A greedy chat request that every server answers the same way."""
    # Greedy and no repeat penalty on every server (llama-server and llama-cpp-python read
    # repeat_penalty; the rest ignore it), so all answer the same way.
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "repeat_penalty": 1.0}


def served_name(url: str, name: str, model: str) -> str:
    """The model id to send: ours by name; another server's first listed model."""
    if name.startswith("localchat serve"):
        return model
    try:
        data = httpx.get(url + "/v1/models", timeout=5).json().get("data") or []
        return str(data[0]["id"]) if data else model
    except (httpx.HTTPError, ValueError, KeyError):
        return model


def stream_chat(client: httpx.Client, base_url: str, body: dict[str, Any],
                on_first_text: Callable[[], None] | None = None) -> Answer:
    """One streamed ``/v1/chat/completions`` request; ``on_first_text`` runs when its first
    text arrives."""
    return _stream(client, base_url.rstrip("/") + "/v1/chat/completions", body, on_first_text)


def stream_completion(client: httpx.Client, base_url: str, body: dict[str, Any],
                      on_first_text: Callable[[], None] | None = None) -> Answer:
    """One streamed ``/v1/completions`` request (``body`` has a ``prompt``), timed as a chat."""
    return _stream(client, base_url.rstrip("/") + "/v1/completions", body, on_first_text)


def stream_infill(client: httpx.Client, base_url: str, body: dict[str, Any]) -> Answer:
    """One streamed llama-server ``/infill`` request (``body`` has ``input_prefix`` and
    ``input_suffix``): timed to its first event, counted from its last."""
    answer = Answer()
    times: list[float] = []
    pieces: list[str] = []
    started = time.perf_counter()
    for event in _events(client, base_url.rstrip("/") + "/infill", {**body, "stream": True},
                         answer):
        if "error" in event:
            answer.error = str(event["error"])[:200]
            break
        times.append(time.perf_counter())
        pieces.append(event.get("content") or "")
        if event.get("stop"):  # the last event: no [DONE] follows in this API
            _read_infill_end(event, answer)
            break
    _finish(answer, started, times, pieces)
    return answer


def _read_infill_end(event: dict[str, Any], answer: Answer) -> None:
    timings = event.get("timings") or {}
    answer.done = True
    answer.finish_reason = "length" if event.get("stop_type") == "limit" else "stop"
    answer.completion_tokens = event.get("tokens_predicted") or 0
    answer.prompt_tokens = event.get("tokens_evaluated")
    answer.cached_tokens = timings.get("cache_n")
    answer.prefilled_tokens = timings.get("prompt_n")


def _stream(client: httpx.Client, url: str, body: dict[str, Any],
            on_first_text: Callable[[], None] | None) -> Answer:
    answer = Answer()
    times: list[float] = []
    pieces: list[str] = []
    started = time.perf_counter()
    for chunk in _events(client, url, {**body, "stream": True,
                                       "stream_options": {"include_usage": True}}, answer):
        had_text = bool(times)
        _read_chunk(chunk, answer, times, pieces)
        if times and not had_text and on_first_text is not None:
            on_first_text()
    _finish(answer, started, times, pieces)
    return answer


def _events(client: httpx.Client, url: str, body: dict[str, Any],
            answer: Answer) -> Iterator[dict[str, Any]]:
    """The SSE stream's ``data:`` events, parsed, until ``[DONE]`` (``answer.done``) or its end;
    the HTTP status, a refusal and a broken stream go into ``answer``."""
    try:
        with client.stream("POST", url, json=body) as response:
            answer.status = response.status_code
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {response.read()[:200]!r}"
                return
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    answer.done = True
                    return
                yield json.loads(payload)
    except (httpx.HTTPError, ValueError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"


def _finish(answer: Answer, started: float, times: list[float], pieces: list[str]) -> None:
    """TTFT and decode speed from the times text arrived."""
    answer.ended_at = time.perf_counter()
    answer.text = "".join(pieces)
    if times:
        answer.ttft_ms = (times[0] - started) * 1000.0
        if len(times) > 1 and times[-1] > times[0]:
            answer.decode_tps = (len(times) - 1) / (times[-1] - times[0])
    answer.completion_tokens = answer.completion_tokens or len(times)


def _read_chunk(chunk: dict[str, Any], answer: Answer, times: list[float], pieces: list[str]) -> None:
    if "error" in chunk:
        answer.error = str(chunk["error"])[:200]
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        content = delta.get("content") or choice.get("text") or ""  # a chat's, a completion's
        if content or delta.get("reasoning_content"):
            times.append(time.perf_counter())
            pieces.append(content)
        if choice.get("finish_reason"):
            answer.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage") or {}
    if usage:
        answer.completion_tokens = usage.get("completion_tokens") or 0
        answer.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            answer.cached_tokens = details["cached_tokens"]
    timings = chunk.get("timings") or {}
    if answer.cached_tokens is None and timings.get("cache_n") is not None:
        answer.cached_tokens = timings["cache_n"]
    if timings.get("prompt_n") is not None:
        answer.prefilled_tokens = timings["prompt_n"]


# -- servers -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def localchat_serve(model: str, n_ctx: int, cache_mib: int,
                    parallel: int | None = None) -> Iterator[str]:
    """``localchat serve`` in a subprocess on a free port (with ``--parallel N`` when given, else
    its configured slots); its base URL."""
    command = [sys.executable, "-m", "localchat", "serve", "--model", model, "--port", "0",
               "--n-ctx", str(n_ctx), "--cache-ram", str(cache_mib)]
    if parallel is not None:
        command += ["--parallel", str(parallel)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        if not first.startswith("localchat serve: http"):
            raise UserError(f"localchat serve did not start: {first.strip() or _stderr(process)}")
        yield first.split(": ", 1)[1].strip()
    finally:
        _stop(process)


def llama_cpp_server_available() -> str | None:
    """Why llama-cpp-python's server cannot run here, or None."""
    import importlib.util

    for module in ("llama_cpp.server", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        try:
            if importlib.util.find_spec(module) is None:
                return f"llama-cpp-python's server is not installed ({module} is missing: "
                "pip install 'llama-cpp-python[server]')"
        except ModuleNotFoundError:
            return f"llama-cpp-python's server is not installed ({module} is missing)"
    return None


@contextlib.contextmanager
def llama_cpp_server(model_path: Path, n_ctx: int, threads: int) -> Iterator[str]:
    """``python -m llama_cpp.server`` on the same model file, on a free port; its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path),
               "--n_ctx", str(n_ctx), "--host", "127.0.0.1", "--port", str(port),
               "--n_threads", str(threads), "--n_threads_batch", str(threads)]
    # Its log goes to a file: llama.cpp's load chatter would fill a pipe nobody reads and block it.
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, process, log=log)
            yield url
        finally:
            _stop(process)


def wait_ready(url: str, process: subprocess.Popen | None = None, timeout: float = 180.0,
               log: IO[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise UserError(f"the server at {url} exited: {_last_line(log)}")
        try:
            if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise UserError(f"the server at {url} did not answer within {timeout:.0f} s")


def _last_line(log: IO[str] | None) -> str:
    if log is None:
        return "(no log)"
    log.seek(0)
    lines = log.read().strip().splitlines()
    return lines[-1] if lines else "(nothing logged)"


def _stderr(process: subprocess.Popen) -> str:
    if process.poll() is None or process.stderr is None:
        return "(still running)"
    lines = process.stderr.read().strip().splitlines()
    return lines[-1] if lines else f"exit status {process.returncode}"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
