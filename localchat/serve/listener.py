"""The listening sockets and the accept loop, kept within the process's file limit.

Every connection holds a file descriptor. Past the limit (``ulimit -n``, RLIMIT_NOFILE) accept
fails (EMFILE), and so does everything else that opens a file: asyncio's own server then logged
each failed accept with a traceback, thousands in seconds, and ``/health`` went unanswered while
idle connections held every descriptor. Here:

- At most ``cap`` connections are open (:func:`connection_cap`: the soft limit, less the files
  open when serving starts, less ``RESERVE`` for what serving opens later: a model switch's
  GGUF, the log, a socket of the engine's). At the cap, the connection idle the longest (waiting
  for its next request) is closed to admit the new one; with none idle, accepting waits for a
  connection to end, and new clients wait in the listen backlog.
- An accept that fails for want of files (EMFILE, ENFILE, ENOBUFS, ENOMEM) is tried again after
  ``BACKOFF_S``; one whose client left first (ECONNABORTED) is skipped.
- Each of these is said once, in one line (``notice``), never with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Collection
from typing import Protocol

RESERVE = 32  # descriptors kept free for what serving opens after it starts
BACKOFF_S = 0.5  # between accepts that failed for want of files
BACKLOG = 100  # connections waiting to be accepted (asyncio's default)
RECHECK_S = 0.1  # at the cap with no connection idle: how often to look again
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_CLIENT_LEFT = {errno.ECONNABORTED, errno.ECONNRESET, errno.EPROTO, errno.EPERM}


class Occupant(Protocol):
    """An open connection, as the listener sees it (``http.Connection``)."""

    idle_since: float | None  # since when it waits for its next request (None: it does not)

    def hang_up(self) -> None: ...


def open_files() -> int | None:
    """How many descriptors this process holds now (None where that cannot be known)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(folder)) - 1  # less the one listing it
    return None


def connection_cap() -> tuple[int, int | None]:
    """(the most connections to hold open, the soft file limit it comes from; None: none)."""
    try:
        import resource
    except ImportError:  # Windows: no descriptor limit of this kind
        return 512, None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536, None
    in_use = open_files()
    return max(8, soft - (64 if in_use is None else in_use) - RESERVE), soft


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` names (as asyncio's ``start_server`` binds
    them); OSError when one cannot be bound."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def say_on_stderr(line: str) -> None:
    print(f"localchat serve: {line}", file=sys.stderr, flush=True)


class Listener:
    """Accepts connections on ``sockets`` and hands each to ``admit``, within the cap (see the
    module). ``occupants`` lists the open connections; whoever serves one calls ``left`` once
    it has closed."""

    def __init__(self, sockets: list[socket.socket], admit: Callable[[socket.socket], None],
                 occupants: Callable[[], Collection[Occupant]],
                 notice: Callable[[str], None] = say_on_stderr,
                 cap: tuple[int, int | None] | None = None) -> None:
        self.sockets = sockets
        self._admit = admit
        self._occupants = occupants
        self._notice = notice
        self.cap, self._file_limit = cap or connection_cap()
        self.open = 0
        self._left = asyncio.Event()
        self._said: set[str] = set()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._accept_on(sock)) for sock in self.sockets]

    async def close(self) -> None:
        """Stop accepting and close the listening sockets (open connections stay)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self.sockets:
            sock.close()

    def left(self) -> None:
        """A connection has closed: room for another."""
        self.open -= 1
        self._left.set()

    async def _accept_on(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._room()
            try:
                client, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in _OUT_OF_FILES:
                    self._say_once("files", f"out of file descriptors ({os.strerror(exc.errno)}): "
                                            f"{self.open} connections open; new ones wait")
                    await asyncio.sleep(BACKOFF_S)
                elif exc.errno not in _CLIENT_LEFT:
                    raise
                continue
            self.open += 1
            self._admit(client)
            # An accept that finds a client waiting does not yield: let the connections start
            # (and the others be served) between two accepts.
            await asyncio.sleep(0)

    async def _room(self) -> None:
        """Return once a connection may be accepted: below the cap, or after closing the one
        idle the longest; with none idle, once one has ended (looking again every
        ``RECHECK_S``: a connection just accepted becomes idle once its task reads)."""
        while self.open >= self.cap:
            limit = f" (the file limit is {self._file_limit})" if self._file_limit else ""
            self._say_once("cap", f"{self.open} connections open, the most this server holds"
                                  f"{limit}; the longest idle ones are closed to admit new ones")
            self._left.clear()
            idle = [c for c in self._occupants() if c.idle_since is not None]
            if idle:
                oldest = min(idle, key=lambda c: c.idle_since or time.monotonic())
                oldest.idle_since = None  # closing: not a candidate again
                oldest.hang_up()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._left.wait(), RECHECK_S)

    def _say_once(self, what: str, line: str) -> None:
        if what not in self._said:
            self._said.add(what)
            self._notice(line)
