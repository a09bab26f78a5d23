"""Ending on a signal: SIGTERM (``kill``, a logout, a service manager) and SIGHUP (the terminal
was closed) end localchat as the user's own stop does, never by their default action, which kills
the process where it stands and loses the reply being written.

- Each front end turns them into its own stop: the app quits as Ctrl+Q does (the reply so far is
  stored, marked stopped, and the context snapshot saved), ``ask`` stops its reply as Ctrl+C does.
- The exit status is the one a shell shows for a process a signal ended, 128 + the signal's
  number: 143 for SIGTERM, 129 for SIGHUP (and Ctrl+C's 130 is SIGINT's).
- A signal the process was started with ignored (``nohup``) stays ignored.
- After SIGHUP, the standard streams that were the terminal which went away are pointed at
  ``/dev/null``: writing to a hung-up terminal fails (EIO) and reading it returns nothing at once,
  and neither may stop the reply from being saved.
"""

from __future__ import annotations

import errno
import os
import signal

# SIGHUP does not exist on Windows.
ENDING_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


class Ended(BaseException):
    """A signal ended the command where there was nothing to keep yet (before its turn began).
    A BaseException, like KeyboardInterrupt: no ``except Exception`` may swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"ended by {signal.Signals(signum).name}")
        self.signum = signum


def exit_status(signum: int) -> int:
    """The exit status of a process that ``signum`` ended: 128 + its number."""
    return 128 + int(signum)


def handled(signals: tuple[int, ...]) -> list[int]:
    """The ``signals`` this process may handle: not those it was started with ignored (nohup)."""
    return [s for s in signals if signal.getsignal(s) is not signal.SIG_IGN]


def detach_lost_terminal() -> bool:
    """Point stdin, stdout and stderr at /dev/null where they are a terminal that hung up (its
    window closed); True if one was. A terminal still there is left alone (a ``kill -HUP`` from
    elsewhere), and so are pipes and files."""
    lost = [fd for fd in (0, 1, 2) if _hung_up(fd)]
    if not lost:
        return False
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in lost:
            os.dup2(null, fd)  # atomic: a write under way elsewhere ends on the old terminal
    finally:
        os.close(null)
    return True


def _hung_up(fd: int) -> bool:
    import termios

    try:
        termios.tcgetattr(fd)
    except termios.error as exc:  # a hung-up terminal answers EIO; a pipe or a file, ENOTTY
        return bool(exc.args) and exc.args[0] == errno.EIO
    except (OSError, ValueError):
        return False
    return False

