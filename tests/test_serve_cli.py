"""``localchat serve`` as a user starts it: a subprocess that prints its URL and models, warns when
it listens beyond this machine without a key, ends a running stream on SIGTERM and exits 0; and
bad flags or a missing model as one line with exit 1."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from serve_fixtures import post, read_response

pytestmark = pytest.mark.model


def serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "localchat", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_serve_prints_its_url_and_sigterm_ends_the_running_stream_and_exits_0(test_model_path):
    process = serve("--model", str(test_model_path), "--host", "0.0.0.0", "--port", "0",
                    "--n-ctx", "512", "--cache-ram", "16")
    try:
        first = process.stdout.readline()
        url = re.match(r"localchat serve: (http://\S+)", first)
        assert url, first + process.stderr.read()
        port = int(url.group(1).rsplit(":", 1)[1])
        announced = "".join(process.stdout.readline() for _ in range(4))
        assert "/v1" in announced and "SmolLM2-135M-Instruct.Q4_1 (loaded, n_ctx 512)" in announced

        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 400, "stream": True}, host=f"127.0.0.1:{port}"))
            data = b""
            while data.count(b"data: ") < 3:
                data += sock.recv(65536)
            process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            while b"data: [DONE]" not in data:
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
            assert time.monotonic() - started < 10
        assert b"shutting down" in data  # the stream says why it ended
        assert process.wait(30) == 0
        stderr = process.stderr.read()
        assert "listening on 0.0.0.0, beyond this machine, with no API key" in stderr
        assert "Traceback" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("args, says", [
    (["--port", "70000"], "--port must be in [0, 65535] (0 picks a free one), not 70000"),
    (["--max-queue", "-1"], "--max-queue must be at least 0, not -1"),
    (["--parallel", "0"], "--parallel must be in [1, 64], not 0"),
    (["-np", "1000"], "--parallel must be in [1, 64], not 1000"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "smollm2-135m"], "run `localchat pull smollm2-135m`"),
])
def test_bad_flags_and_missing_models_are_one_line_and_exit_1(args, says):
    result = subprocess.run([sys.executable, "-m", "localchat", "serve", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and says in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_busy_port_is_one_line(test_model_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "localchat", "serve", "--model",
                                 str(test_model_path), "--port", str(port), "--n-ctx", "256"],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_read_response_helper_reads_a_plain_answer():  # the helper other serve tests rely on
    with socket.socket() as server_socket:
        server_socket.bind(("127.0.0.1", 0))
        server_socket.listen()
        client = socket.create_connection(server_socket.getsockname())
        peer, _ = server_socket.accept()
        peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        assert read_response(client) == (200, {"content-length": "2"}, b"ok")
        client.close()
        peer.close()
