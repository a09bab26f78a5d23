"""A fake PyPI on 127.0.0.1 for the PyPI source: a PEP 503 simple index with one wheel per
package, sent at a set rate so a test (or a person in tmux) can watch the bytes arrive.

pip finds it through ``PIP_INDEX_URL`` (``index_url``), as it would a company mirror:

- ``GET /simple/{name}/`` -> the project page: one link to the wheel, with its sha256.
- ``GET /files/{wheel}`` -> the wheel, with ``Content-Length``, in ``chunk``-byte writes spaced
  to ``bytes_per_s`` (0: as fast as the socket takes them).

``python tests/pypi_server.py PACKAGE VERSION MEMBER FILE [MB_PER_S]`` serves a wheel holding
FILE as MEMBER until Ctrl+C, and prints the ``PIP_INDEX_URL`` to use.
"""

from __future__ import annotations

import hashlib
import io
import re
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_wheel(package: str, version: str, files: dict[str, bytes]) -> tuple[str, bytes]:
    """A minimal pure-Python wheel holding ``files`` (stored, not compressed): (file name, bytes)."""
    dist = f"{re.sub(r'[-_.]+', '_', package)}-{version}"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
        wheel.writestr(f"{dist}.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        wheel.writestr(f"{dist}.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: localchat-tests\nRoot-Is-Purelib: true\n"
                       "Tag: py3-none-any\n")
        wheel.writestr(f"{dist}.dist-info/RECORD", "")
    return f"{dist}-py3-none-any.whl", buffer.getvalue()


@dataclass
class FakePyPI:
    bytes_per_s: float = 0.0
    chunk: int = 64 * 1024
    wheels: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # normalised name -> wheel
    gets: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def add_wheel(self, package: str, version: str, files: dict[str, bytes]) -> None:
        self.wheels[_normalise(package)] = make_wheel(package, version, files)

    @property
    def index_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    def start(self) -> FakePyPI:
        pypi = self

        class Handler(_IndexHandler):
            index = pypi

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakePyPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _IndexHandler(BaseHTTPRequestHandler):
    index: FakePyPI

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.index.gets.append(self.path)
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "simple" and _normalise(parts[1]) in self.index.wheels:
            name, content = self.index.wheels[_normalise(parts[1])]
            digest = hashlib.sha256(content).hexdigest()
            self._send(f'<html><body><a href="/files/{name}#sha256={digest}">{name}</a></body></html>'
                       .encode(), "text/html")
            return
        wheel = next((w for w in self.index.wheels.values() if parts == ["files", w[0]]), None)
        if wheel is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send(wheel[1], "application/octet-stream")

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if content_type != "text/html":  # as PyPI's files: pip may keep them in its cache
            self.send_header("Cache-Control", "max-age=365000000, immutable, public")
        self.end_headers()
        rate, chunk = self.index.bytes_per_s, self.index.chunk
        try:
            for start in range(0, len(body), chunk):
                self.wfile.write(body[start:start + chunk])
                if rate and content_type != "text/html":
                    time.sleep(chunk / rate)
        except (BrokenPipeError, ConnectionResetError):
            pass


if __name__ == "__main__":
    package, version, member, path = sys.argv[1:5]
    rate = float(sys.argv[5]) * 1e6 if len(sys.argv) > 5 else 10e6
    server = FakePyPI(bytes_per_s=rate)
    server.add_wheel(package, version, {member: Path(path).read_bytes()})
    server.start()
    print(f"PIP_INDEX_URL={server.index_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
