"""A fake Hugging Face Hub on 127.0.0.1 for download tests, plus a tiny GGUF file writer.

It answers what huggingface_hub asks of the real Hub when downloading one file:

- ``HEAD/GET /{org}/{repo}/resolve/{revision}/{path}`` -> 302 to a CDN URL, carrying
  ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256), ``X-Linked-Size`` and ``ETag``, or 404 with
  ``X-Error-Code: EntryNotFound`` / ``RepoNotFound`` like the Hub.
- ``GET /cdn/{sha256}`` -> the bytes, honouring ``Range: bytes=N-`` with 206 + ``Content-Range``.
  The CDN URL uses the host name ``localhost`` instead of ``127.0.0.1`` so that, as with the real
  CDN, it is a different origin from the Hub (huggingface_hub then stops following the redirect
  at HEAD time and drops the Authorization header).

Faults: ``drop_after(n, times)`` closes the connection after ``n`` body bytes on the next ``times``
CDN GETs; ``stall_after(n)`` sends ``n`` body bytes on the next CDN GET and then nothing more,
and later GETs send no body byte at all (a Hub that stopped sending); ``corrupt`` serves bytes
that do not match the advertised sha256.
Every request is recorded in ``requests`` (method, path, headers) for assertions.
"""

from __future__ import annotations

import hashlib
import random
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]

    @property
    def range_start(self) -> int | None:
        value = self.headers.get("range")
        if not value or not value.startswith("bytes="):
            return None
        return int(value[len("bytes="):].split("-")[0])


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (repo, path) -> content
    corrupt: bool = False
    requests: list[Request] = field(default_factory=list)
    _drop_after: int | None = None
    _drops_left: int = 0
    _stall_after: int | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None

    def add_file(self, repo: str, path: str, content: bytes) -> str:
        """Serve ``content`` as ``repo``/``path``; returns its sha256 (the LFS etag)."""
        self.files[(repo, path)] = content
        return hashlib.sha256(content).hexdigest()

    def drop_after(self, n_bytes: int, times: int = 1) -> None:
        self._drop_after, self._drops_left = n_bytes, times

    def stall_after(self, n_bytes: int) -> None:
        self._stall_after = n_bytes

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cdn_gets(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.startswith("/cdn/")]

    def start(self) -> FakeHub:
        hub = self

        class Handler(_HubHandler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_drop(self) -> int | None:
        if self._drops_left > 0:
            self._drops_left -= 1
            return self._drop_after
        return None


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:
        self._handle(send_body=False)

    def do_GET(self) -> None:
        self._handle(send_body=True)

    def _handle(self, send_body: bool) -> None:
        path = unquote(self.path.split("?", 1)[0])
        self.fake.requests.append(
            Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if path.startswith("/cdn/"):
            self._serve_cdn(path[len("/cdn/"):], send_body)
        elif "/resolve/" in path:
            self._serve_resolve(path, send_body)
        else:
            self._empty(404, {"X-Error-Code": "RepoNotFound"})

    def _serve_resolve(self, path: str, send_body: bool) -> None:
        repo, _, rest = path.lstrip("/").partition("/resolve/")
        _revision, _, filename = rest.partition("/")
        if not any(r == repo for r, _ in self.fake.files):
            self._empty(401, {"X-Error-Code": "RepoNotFound",
                              "X-Error-Message": "Repository not found"})
            return
        content = self.fake.files.get((repo, filename))
        if content is None:
            self._empty(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT,
                              "X-Error-Message": "Entry not found"})
            return
        sha = hashlib.sha256(content).hexdigest()
        self._empty(302, {
            "Location": f"http://localhost:{self.fake.port}/cdn/{sha}?repo={repo}",
            "X-Repo-Commit": COMMIT,
            "X-Linked-Etag": f'"{sha}"',
            "X-Linked-Size": str(len(content)),
            "ETag": '"0000000000000000000000000000000000000000"',  # the git pointer's sha1
        })

    def _serve_cdn(self, sha: str, send_body: bool) -> None:
        content = next((c for c in self.fake.files.values()
                        if hashlib.sha256(c).hexdigest() == sha), None)
        if content is None:
            self._empty(404, {})
            return
        if self.fake.corrupt:
            content = bytes([content[0] ^ 0xFF]) + content[1:]
        start = Request("GET", "", {"range": self.headers.get("Range", "")}).range_start or 0
        body = content[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.end_headers()
        if not send_body:
            return
        stall = self.fake._stall_after
        if stall is not None:
            self.fake._stall_after = 0  # later requests get nothing at all
            self.wfile.write(body[:stall])
            self.wfile.flush()
            self.fake._stopped.wait(30)  # silent until the client gives up (or the test ends)
            self.close_connection = True
            return
        drop = self.fake._take_drop()
        if drop is not None:
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True  # the client sees the body end early
            return
        self.wfile.write(body)

    def _empty(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


# --- a tiny GGUF writer --------------------------------------------------------------------------

_GGUF_TYPES = {int: 4, float: 6, bool: 7, str: 8}  # u32, f32, bool, string


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf_value(value: object) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<Ii", 5, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _gguf_string(value)
    if isinstance(value, list):
        element_type = _GGUF_TYPES[type(value[0])] if value else 4
        body = b"".join(_gguf_value(v)[4:] for v in value)
        return struct.pack("<IIQ", 9, element_type, len(value)) + body
    raise TypeError(type(value))


def make_gguf(*, version: int = 3, n_layers: int = 2, embedding: int = 64,
              context_length: int = 2048, vocab: int = 2000, data_elements: int = 64 * 1024,
              chat_template: str | None = "{{ messages }}", seed: int = 0) -> bytes:
    """A small but well-formed GGUF model file (random weights; llama.cpp would not run it).

    ``data_elements`` F32 values of token embedding make up most of the size (4 bytes each).
    """
    metadata: dict[str, object] = {
        "general.architecture": "llama",
        "general.name": "Fake Test Model",
        "llama.block_count": n_layers,
        "llama.context_length": context_length,
        "llama.embedding_length": embedding,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "tokenizer.ggml.tokens": [f"tok{i}" for i in range(vocab)],
    }
    if chat_template is not None:
        metadata["tokenizer.chat_template"] = chat_template
    # (name, shape, ggml type, bytes)
    tensors = [("token_embd.weight", (embedding, data_elements // embedding), 0, data_elements * 4)]
    for layer in range(n_layers):
        tensors.append((f"blk.{layer}.attn_q.weight", (embedding, embedding), 8,
                        embedding * embedding // 32 * 34))
        tensors.append((f"blk.{layer}.attn_norm.weight", (embedding,), 0, embedding * 4))
    header = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, value in metadata.items():
        header += _gguf_string(key) + _gguf_value(value)
    offset, infos = 0, b""
    for name, shape, ggml_type, n_bytes in tensors:
        infos += _gguf_string(name) + struct.pack("<I", len(shape))
        infos += b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", ggml_type, offset)
        offset += -(-n_bytes // 32) * 32
    header += infos
    header += b"\0" * (-len(header) % 32)
    return header + random.Random(seed).randbytes(offset)
