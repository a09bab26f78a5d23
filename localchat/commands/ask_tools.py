"""``localchat ask``'s tools: the flags, and the question put to the user before a call runs.

- ``--tool-choice auto|none|required|NAME`` (OpenAI's meaning: ``required`` makes the model
  call some tool, ``NAME`` that one; ``none`` offers none);
- ``--allow-tool NAME`` (repeatable): calls of that tool run without asking; ``'*'`` every tool,
  ``server.*`` all of a server's, ``server.tool`` one of one server's;
- any other call is asked about on the terminal (``/dev/tty``, as ``sudo`` asks, so that a piped
  prompt or a redirected reply still gets the question): ``y`` once, ``a`` always (this run; for
  ``run_command`` only that command), ``s`` always, saved in config.toml, ``n`` or nothing: no.
  Without a terminal the call is denied, with a notice naming ``--allow-tool``.

The question is read on a thread of its own while the main thread waits for the answer, so that
Ctrl+C (which stops the turn, and denies the question) is heard at once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Protocol

from localchat.events import ApprovalQuestion, Decision, Notice, ToolApproval
from localchat.terminal import visible

_ANSWERS = {"y": Decision.ONCE, "yes": Decision.ONCE, "a": Decision.SESSION,
            "always": Decision.SESSION, "s": Decision.SAVE, "save": Decision.SAVE,
            "n": Decision.DENY, "no": Decision.DENY, "": Decision.DENY}


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tool-choice", default="auto", metavar="auto|none|required|NAME",
                   help="whether the model may (auto, the default), may not (none) or must "
                   "(required, or NAME: that tool) call a tool; tools come from mcp.json and "
                   "config.toml's [tools]")
    p.add_argument("--allow-tool", action="append", default=[], metavar="NAME",
                   help="run calls of this tool without asking (repeatable; '*' for all, "
                   "'server.*' for a server's); others are asked about on the terminal, or "
                   "denied without one")


class Terminal(Protocol):
    """Where a question is put and its answer read (a ``Tty``; a script in tests)."""

    def write(self, text: str) -> int: ...
    def flush(self) -> None: ...
    def readline(self) -> str: ...
    def close(self) -> None: ...


class Tty:
    """The controlling terminal, read and written as text. A terminal cannot seek, and Python's
    read-write text mode (``open("/dev/tty", "r+")``) needs a stream that can: it raised
    ``io.UnsupportedOperation`` on every real terminal, so every call was denied as if there
    were none. One descriptor, a reader and a writer over it."""

    def __init__(self, fd: int) -> None:
        self._reader = open(fd, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - kept open for the run
        self._writer = open(fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 - owns fd

    def write(self, text: str) -> int:
        return self._writer.write(text)

    def flush(self) -> None:
        self._writer.flush()

    def readline(self) -> str:
        return self._reader.readline()

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


def open_tty() -> Tty | None:
    """The controlling terminal for a question, or None when there is none."""
    try:
        return Tty(os.open("/dev/tty", os.O_RDWR | getattr(os, "O_NOCTTY", 0)))
    except OSError:
        return None


class Approver:
    """Answers each ``ToolApproval`` of an ``ask`` run (see the module)."""

    def __init__(self, tty_opener: Callable[[], Terminal | None] | None = None) -> None:
        self._open = tty_opener or (lambda: open_tty())
        self._tty: Terminal | None = None
        self._opened = False

    def close(self) -> None:
        if self._tty is not None:
            self._tty.close()
            self._tty = None

    def __call__(self, event: ToolApproval) -> Notice | None:
        """Answer ``event.request`` (waiting for the user if there is a terminal); a notice to
        show, if any."""
        request = event.request
        if not self._opened:
            self._tty, self._opened = self._open(), True
        tty = self._tty
        if tty is None:
            request.answer(Decision.DENY)
            return Notice(f"{request.tool.label}: denied (no terminal to ask; allow it with "
                          f"--allow-tool {request.tool.name})", kind="tools")
        picked: concurrent.futures.Future[Decision] = concurrent.futures.Future()
        threading.Thread(target=self._ask, args=(tty, request, picked), daemon=True,
                         name="localchat-ask-approval").start()
        # Ctrl+C stops the turn, which answers the request (DENY): either ends the wait.
        concurrent.futures.wait([picked, request.future],
                                return_when=concurrent.futures.FIRST_COMPLETED)
        if request.future.done():
            return None
        notice = request.answer(picked.result())
        return Notice(notice, kind="tools") if notice else None

    def _ask(self, tty: Terminal, request: ApprovalQuestion,
             picked: concurrent.futures.Future[Decision]) -> None:
        choices = "[y] once, [a] always this run" + (", [s] always, saved" if request.can_save
                                                      else "") + ", [n] no"
        scope = " (this exact command)" if request.per_command else ""
        decision: Decision | None = None
        try:
            tty.write(f"\n⚙ run {visible(request.line, newlines=False)}{scope}?\n  {choices}: ")
            tty.flush()
            while decision is None and not request.future.done():
                line = tty.readline()
                if not line:  # the terminal closed
                    decision = Decision.DENY
                    break
                decision = _ANSWERS.get(line.strip().lower())
                if decision is Decision.SAVE and not request.can_save:
                    decision = None
                if decision is None:
                    tty.write(f"  {choices}: ")
                    tty.flush()
        except (OSError, ValueError):  # the terminal went away, or was closed under us
            decision = Decision.DENY
        if decision is not None:
            picked.set_result(decision)
