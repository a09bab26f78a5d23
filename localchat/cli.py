"""Command-line entry point: argument parsing and dispatch. User errors are caught here, once,
and shown as one line with a non-zero exit status."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys

from localchat import __version__
from localchat.ending import Ended, exit_status
from localchat.errors import UserError

# Each module in localchat.commands defines ``register(subparsers)``, which adds its sub-command
# and sets ``func(args) -> int`` on it. Imports stay lazy inside the commands so that
# ``localchat --help`` does not pay for llama.cpp or Textual.
COMMAND_MODULES = [
    "localchat.commands.ask",
    "localchat.commands.bench",
    "localchat.commands.models",
    "localchat.commands.doctor",
    "localchat.commands.sessions",
    "localchat.commands.stats",
    "localchat.commands.serve",
    "localchat.commands.tools",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localchat",
        description="Local, offline-first chat in the terminal. With no command, opens the app.",
    )
    parser.add_argument("--version", action="version", version=f"localchat {__version__}")
    parser.add_argument("--model", "-m", help="registry name, hf:ORG/REPO/FILE.gguf or a .gguf path")
    parser.add_argument("--continue", dest="continue_last", action="store_true",
                        help="reopen the most recently used session")
    parser.add_argument("--session", "-s", help="open the session with this id or name (a new name starts one)")
    parser.add_argument("--speculative", choices=("auto", "ngram", "draft", "off"),
                        help="speculative decoding (default: [engine] speculative, off)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def _run_app(args: argparse.Namespace) -> int:
    from localchat.store.store import check_session_name
    from localchat.tui.launch import run_app

    if args.session is not None:
        check_session_name(args.session)  # `--session ""` would otherwise be ignored silently

    return run_app(model=args.model, continue_last=args.continue_last, session=args.session,
                   speculative=args.speculative)


def require_utf8_arguments(argv: list[str]) -> None:
    """Refuse arguments that are not UTF-8 text (Python hands such bytes on as lone surrogates,
    which no name, search or file can hold)."""
    from localchat.terminal import visible

    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"the argument '{visible(arg)}' is not valid UTF-8 text (localchat "
                            "reads arguments as UTF-8: check the terminal's encoding or LANG)"
                            ) from None


# A reader that left (`localchat models | head -c1`) ends the command quietly with the status a
# shell gives a process killed by SIGPIPE, 128 + 13, as `ls | head` does.
EXIT_CLOSED_PIPE = 141
# Errors of writing the output that the user can act on: a full disk (or /dev/full), a quota.
_OUTPUT_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None) or _run_app
    try:
        require_utf8_arguments(sys.argv[1:] if argv is None else argv)
        if func is not _run_app:  # the app draws its own screen
            from localchat.terminal import guard_std_streams

            guard_std_streams()
        code = func(args)
        sys.stdout.flush()  # here, not at interpreter exit, so that a write error is seen below
        return code
    except UserError as exc:
        print(f"localchat: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Ended as exc:  # SIGTERM or SIGHUP before there was anything to keep
        return exit_status(exc.signum)
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_CLOSED_PIPE
    except OSError as exc:
        # Writing stdout failed (no file name: a path's error would name it, and is not ours).
        if exc.errno not in _OUTPUT_FULL or exc.filename is not None:
            raise
        _discard_stdout()
        with contextlib.suppress(OSError):
            print(f"localchat: error: the output could not be written: {exc.strerror} "
                  "(is the disk full?)", file=sys.stderr)
        return 1


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at interpreter exit does not fail again with
    "Exception ignored ... BrokenPipeError" (what the Python docs advise for SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
