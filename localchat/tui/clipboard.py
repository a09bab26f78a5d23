"""Copying text out of the app, in terminals that cooperate and in those that do not.

The app first sends the text with OSC 52 (``App.copy_to_clipboard``), which reaches the system
clipboard in most modern terminals, also over SSH, but is silently ignored by some (macOS
Terminal, tmux without ``set-clipboard on``). Nothing tells us whether it worked, so
``copy_fallback`` also hands the text to tmux's paste buffer inside tmux, or to a local clipboard
tool when one is installed, and otherwise saves it to a file the user can open; its notice says
where the text surely is.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.atomic import write_text_atomic
from localchat.paths import cache_dir

if TYPE_CHECKING:
    from textual.app import App

# First one found wins. Each reads the text on stdin.
CLIPBOARD_TOOLS: tuple[tuple[str, ...], ...] = (
    ("pbcopy",),
    ("wl-copy",),
    ("xclip", "-selection", "clipboard"),
    ("xsel", "--clipboard", "--input"),
    ("clip.exe",),
)


def clipboard_file() -> Path:
    return cache_dir() / "clipboard.txt"


def copy_fallback(text: str) -> str:
    """Copy ``text`` with a clipboard tool, or else save it to ``clipboard_file()``.

    Blocking (runs a process or writes a file): call it off the UI thread. Returns a one-line
    description of where the text went, for a notice.
    """
    if in_tmux() and _run(("tmux", "load-buffer", "-w", "-"), text):
        # -w (tmux 3.2+) also hands it to the outer terminal's clipboard where tmux may.
        return (f"Copied {len(text)} characters to tmux's paste buffer (prefix + ] pastes it; "
                "tmux forwards it to the system clipboard if its set-clipboard option allows).")
    for command in CLIPBOARD_TOOLS:
        if _run(command, text):
            return f"Copied {len(text)} characters to the clipboard."
    path = clipboard_file()
    write_text_atomic(path, text)
    # OSC 52 was sent, but nothing tells whether the terminal took it: say where it surely is.
    return (f"Saved {len(text)} characters to {path}; also sent to the terminal's clipboard "
            "(OSC 52), which some terminals ignore.")


def _run(command: tuple[str, ...], text: str) -> bool:
    if shutil.which(command[0]) is None:
        return False
    try:
        # Output to DEVNULL: xclip keeps running to serve the selection and must not hold our pipes.
        subprocess.run(command, input=text.encode(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=3, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def in_tmux() -> bool:
    return bool(os.environ.get("TMUX"))


def osc52_sequence(text: str) -> str:
    """The OSC 52 "set clipboard" sequence; inside tmux wrapped for passthrough (reaches the
    outer terminal when tmux has ``allow-passthrough on``; tmux drops it otherwise)."""
    sequence = f"\x1b]52;c;{base64.b64encode(text.encode()).decode()}\a"
    if in_tmux():
        return "\x1bPtmux;" + sequence.replace("\x1b", "\x1b\x1b") + "\x1b\\"
    return sequence


def copy_text(app: App[Any], text: str) -> None:
    """Copy ``text``: OSC 52 (tmux passthrough inside tmux), then a fallback that says where
    the text surely went."""
    if in_tmux():  # Textual's plain OSC 52 would stop at tmux
        app._clipboard = text
        if app._driver is not None:
            app._driver.write(osc52_sequence(text))  # on this thread: it writes to the terminal
    else:
        app.copy_to_clipboard(text)

    def copy() -> None:
        message = copy_fallback(text)
        app.call_from_thread(app.notify, message)

    app.run_worker(copy, thread=True, group="clipboard", exit_on_error=False)
