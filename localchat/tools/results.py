"""What a call's result becomes before anyone sees it: plain text, inert, capped, with a notice.

A tool's output is data from outside: a server may answer with 10 MB, with terminal escapes that
would clear the screen or write the clipboard (OSC 52), with images. :func:`make_result` turns any
output into the :class:`~localchat.reply.calls.ToolResult` the model reads and the user sees:
escape sequences removed and other controls shown inert (``terminal.visible``), the size capped
with a note that says so, and a one-line notice for the user whenever something was changed or
went wrong. :func:`error_result` is the shape of every failure (a timeout, a crash, a tool that
does not exist, a :class:`ToolFailure` raised by a server or a built-in): text for the model, a
notice for the user, never a traceback.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localchat.reply.calls import ToolCall, ToolResult
from localchat.terminal import visible

# ANSI/VT escape sequences: CSI (colours, cursor moves), OSC (titles, clipboard, hyperlinks)
# ended by BEL or ST or cut off, DCS/SOS/PM/APC strings, two-character escapes, 8-bit CSI/OSC.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x9d[^\x07\x9c]*(?:\x07|\x9c)?"
)
NOTICE_CHARS = 120  # a notice is one line: what it quotes is cut to this


class ToolFailure(Exception):
    """A call that could not be made or did not finish; the message is for the model and user
    (:func:`error_result` gives it to them)."""


def inert(text: str) -> tuple[str, bool]:
    """``text`` with escape sequences removed and any other control or invisible character shown
    as inert text; and whether anything had to be changed."""
    cleaned = _ESCAPES.sub("", text.replace("\r\n", "\n"))
    shown = visible(cleaned)
    return shown, cleaned != text.replace("\r\n", "\n") or shown != cleaned


def capped(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` with a note saying so (the note fits within the cap)."""
    if len(text) <= max_chars:
        return text, False
    note = f"\n[... the result was cut here: {len(text):,} characters in all, the first "
    note += "{:,} shown]"
    keep = max(0, max_chars - len(note) - 12)
    return text[:keep] + note.format(keep), True


def one_line(text: str, limit: int = NOTICE_CHARS) -> str:
    """``text`` as one short inert line, for a notice."""
    line = " ".join(visible(text, newlines=False).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def make_result(call: ToolCall, label: str, text: str, is_error: bool,
                max_chars: int) -> ToolResult:
    """The result of a call that ran (``label`` names it for the user: ``server.tool``)."""
    text, changed = inert(text)
    text, cut = capped(text, max_chars)
    notes = []
    if is_error:
        notes.append(f"the tool reported an error: {one_line(text, 80)}")
    if changed:
        notes.append("terminal control characters in the result were removed")
    if cut:
        notes.append(f"the result was cut to {max_chars:,} characters")
    notice = f"{label}: {'; '.join(notes)}" if notes else ""
    return ToolResult(call.id, call.name, text if text else "(no output)", is_error, notice)


def error_result(call: ToolCall, label: str, message: str) -> ToolResult:
    """A call that failed: the model reads ``error: message``, the user a notice naming it."""
    message = one_line(message, 400)
    return ToolResult(call.id, call.name, f"error: {message}", is_error=True,
                      notice=f"{label}: {one_line(message)}")


def cancelled_result(call: ToolCall, label: str) -> ToolResult:
    """A call the user stopped (Esc): the model is told so."""
    return ToolResult(call.id, call.name, "error: the call was cancelled by the user",
                      is_error=True, notice=f"{label}: cancelled")


def denied_result(call: ToolCall, label: str) -> ToolResult:
    """A call the user did not allow: it never ran, and the model is told why."""
    return ToolResult(call.id, call.name, "denied by the user", is_error=True,
                      notice=f"{label}: denied")


def mcp_text(content: list[Any], structured: Any = None) -> str:
    """An MCP result's content blocks as text: text as it is, other media described."""
    parts = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind in ("image", "audio"):
            data = getattr(block, "data", "") or ""
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '?')}, about "
                         f"{len(data) * 3 // 4:,} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '?')}]")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            parts.append(text if isinstance(text, str) else
                         f"[resource: {getattr(resource, 'uri', '?')}, "
                         f"{getattr(resource, 'mime_type', None) or 'binary'}, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)
