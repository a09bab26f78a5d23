"""Copying text out of the app, in terminals that cooperate and in those that do not.

The app first sends the text with OSC 52 (``App.copy_to_clipboard``), which reaches the system
clipboard in most modern terminals, also over SSH, but is silently ignored by some (macOS
Terminal, tmux without ``set-clipboard on``). Nothing tells us whether it worked, so
``copy_fallback`` also hands the text to a local clipboard tool when one is installed, and
otherwise saves it to a file the user can open.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from localchat.atomic import write_text_atomic
from localchat.paths import cache_dir

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
    for command in CLIPBOARD_TOOLS:
        if shutil.which(command[0]) is None:
            continue
        try:
            # Output to DEVNULL: xclip keeps running to serve the selection and must not hold our pipes.
            subprocess.run(command, input=text.encode(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=3, check=True)
        except (OSError, subprocess.SubprocessError):
            continue
        return f"Copied {len(text)} characters to the clipboard."
    path = clipboard_file()
    write_text_atomic(path, text)
    return f"Copied {len(text)} characters via the terminal (OSC 52); also saved to {path}."
