"""What ``localchat ask`` writes: the reply as plain text on stdout (the summary and notices on
stderr), or JSON Lines events with ``--json``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TextIO

from localchat.commands import answer_shape
from localchat.events import (
    Decision,
    Done,
    Event,
    Failed,
    Notice,
    PrefillProgress,
    RouteChanged,
    Thinking,
    Timings,
    Token,
    ToolApproval,
    ToolCalled,
    ToolReturned,
)
from localchat.terminal import raw, shows_styles, visible
from localchat.tools.approval import call_line

if TYPE_CHECKING:
    from collections.abc import Callable

    from localchat.formats import AnswerFormat


def _unread(shown: str, whole: str) -> str:
    """The end of a stopped reply that was not shown: a stop drops the tokens still queued (see
    ``events.Turn``), and the final ``Done`` holds them."""
    return whole[len(shown):] if whole.startswith(shown) else ""


class PlainText:
    """Reply text on stdout, summary on stderr (on a terminal, the CLI's guard neutralises
    control sequences in both: see localchat.terminal)."""

    def __init__(self, stdout: TextIO, stderr: TextIO, hide_thinking: bool = False) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self._remote_text = ""  # reply text on stdout since the last route notice
        self._unshown_reply = False  # a fallback kept a reply that is not on stdout after it
        self.hide_thinking = hide_thinking
        self._thinking_open = False  # reasoning was written to stderr and not yet ended
        self.user_stopped = False  # Ctrl+C, SIGTERM or SIGHUP stopped it (ask.Interruptions)
        # A shaped answer is held back and written whole at the end, on stdout only when it is
        # complete and of its shape (``answer_shape.verdict``), else on stderr with why not.
        self.answer_format: AnswerFormat | None = None
        self.shape_problem: str | None = None
        # Answers a tool call's question (commands.ask_tools.Approver); None denies.
        self.approve: Callable[[ToolApproval], Notice | None] | None = None

    def _write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def event(self, event: Event) -> None:
        if isinstance(event, (ToolCalled, ToolApproval, ToolReturned)):
            self._tool_event(event)
            return
        if isinstance(event, Thinking):
            if not self.hide_thinking and event.text:
                self._write_thinking(event.text)
            return
        if self._thinking_open and (isinstance(event, (Done, Failed)) or
                                    (isinstance(event, Token) and event.text)):
            self.stderr.write("\n")  # the reasoning ends where the answer begins
            self.stderr.flush()
            self._thinking_open = False
        if isinstance(event, Token) and event.text:
            if self.answer_format is None:
                self._write(event.text)
                self._remote_text += event.text
                self._unshown_reply = False
        elif isinstance(event, RouteChanged):
            self._route_changed(event)
        elif isinstance(event, Done) and self.answer_format is not None:
            self._shaped_done(event, self.answer_format)
        elif isinstance(event, Done):
            if self._unshown_reply and event.reply:
                self._write(event.reply)
            elif event.finish_reason == "aborted":
                self._write(_unread(self._remote_text, event.answer))
            self.stdout.write("\n")
            self.stdout.flush()
            if event.finish_reason == "aborted" and self.user_stopped:
                self.stderr.write("[stopped]\n")
            self.stderr.write(summary_line(event.timings) + "\n")
        elif isinstance(event, Failed):
            self.stdout.flush()
            self.stderr.write(f"localchat: error: {event.message}\n")
        elif isinstance(event, Notice):
            self.stderr.write(f"localchat: {event.message}\n")

    def _tool_event(self, event: ToolCalled | ToolApproval | ToolReturned) -> None:
        """⚙ lines on stderr; the reply before a call ends its line on stdout."""
        if isinstance(event, ToolApproval):
            notice = answer_approval(self.approve, event)
            if notice is not None:
                self.event(notice)
            return
        if isinstance(event, ToolCalled):
            if self._remote_text and not self._remote_text.endswith("\n"):
                self._write("\n")
            self._remote_text = ""
            self.stderr.write(f"⚙ {call_line(event.call, limit=None)}\n")  # whole: see call_line
        else:
            result = event.result
            if result.notice:
                self.stderr.write(f"localchat: {result.notice}\n")
            elif not result.is_error:
                self.stderr.write(f"⚙ {result.name}: {len(result.content):,} characters in "
                                  f"{event.elapsed_ms:.0f} ms\n")
        self.stderr.flush()

    def _shaped_done(self, event: Done, answer_format: AnswerFormat) -> None:
        self.shape_problem = answer_shape.verdict(answer_format, event)
        if self.shape_problem is None:
            self._write(event.answer + "\n")
        else:
            self.stderr.write(f"localchat: error: {self.shape_problem}\n")
            if event.answer:
                self.stderr.write(event.answer + "\n")
        if event.finish_reason == "aborted" and self.user_stopped:
            self.stderr.write("[stopped]\n")
        self.stderr.write(summary_line(event.timings) + "\n")
        self.stderr.flush()

    def _route_changed(self, event: RouteChanged) -> None:
        """Keep stdout honest when the reply changes hands: a local reply handed over part-way is
        marked superseded on its own line before the remote's answer; a remote reply that fails
        part-way is marked void, and the local reply that stands follows the marker."""
        self.stderr.write(f"localchat: {event.message}\n")
        if event.route == "remote":
            if self._remote_text:  # local text is on stdout: say it is not the answer
                self.stdout.write("\n[local reply superseded; the remote model's answer follows]\n")
                self.stdout.flush()
            self._remote_text = ""
            return
        if self._remote_text:
            self.stdout.write("\n[remote reply failed; the text above is void]\n")
            self.stdout.flush()
        self._remote_text = ""
        self._unshown_reply = True

    def error(self, message: str, code: int = 1) -> int:
        self.stderr.write(f"localchat: error: {message}\n")
        return code

    def _write_thinking(self, text: str) -> None:
        """Reasoning goes to stderr, dimmed on a terminal that shows it, so stdout holds only the
        answer."""
        stderr = raw(self.stderr)  # the dimming escapes are ours; the model's text is not
        if stderr.isatty():
            text = visible(text)
            if shows_styles(stderr):
                text = f"\x1b[2m{text}\x1b[22m"
        stderr.write(text)
        stderr.flush()
        self._thinking_open = True


def answer_approval(approve: Callable[[ToolApproval], Notice | None] | None,
                    event: ToolApproval) -> Notice | None:
    """Answer a call's question through ``approve``; without one it is denied."""
    if approve is not None:
        return approve(event)
    event.request.answer(Decision.DENY)
    return None


class JsonEvents:
    """One JSON object per line: thinking, token, prefill, notice, superseded, retract, restore,
    tool_call, tool_result, done, error. With tools, a turn's replies follow each other: the
    token texts of each reply before a ``tool_call`` end that reply, and those after the last
    ``tool_result`` are the final one. The token texts of a reply not voided add up to it:

    - ``superseded`` (before an escalate notice) voids the token text so far: the local reply
      handed to the remote part-way, kept aside (its ``text``); the remote's tokens follow.
    - ``retract`` (before a fallback notice) voids the token text since the escalate notice: the
      remote reply that failed part-way. If a local reply was superseded, a ``restore`` with its
      text follows: it is the reply kept after all.
    - A stopped reply's ``done`` follows a ``token`` with id -1 holding the text the stop left
      unread, if any (the tokens still queued when it came).
    """

    def __init__(self, stdout: TextIO, hide_thinking: bool = False) -> None:
        self.stdout = stdout
        self._remote_text = ""  # token text since the last route notice
        self._superseded = ""  # the local partial reply set aside by a mid-reply escalation
        self.hide_thinking = hide_thinking
        self.user_stopped = False  # Ctrl+C, SIGTERM or SIGHUP stopped it (ask.Interruptions)
        self.answer_format: AnswerFormat | None = None  # the done event says if the answer has it
        self.shape_problem: str | None = None
        self.approve: Callable[[ToolApproval], Notice | None] | None = None
        self._labels: dict[str, str] = {}  # call id -> server.tool

    def _write(self, obj: dict) -> None:
        self.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.stdout.flush()

    def event(self, event: Event) -> None:
        if isinstance(event, ToolCalled):
            self._remote_text = ""  # the reply that called is complete: its tokens were sent
            self._labels[event.call.id] = event.label
            call = {"event": "tool_call", "id": event.call.id, "name": event.call.name,
                    "label": event.label, "arguments": event.call.arguments}
            if event.call.problem:
                call["problem"] = event.call.problem
            self._write(call)
        elif isinstance(event, ToolApproval):
            notice = answer_approval(self.approve, event)
            if notice is not None:
                self.event(notice)
        elif isinstance(event, ToolReturned):
            result = event.result
            self._write({"event": "tool_result", "id": result.call_id, "name": result.name,
                         "label": self._labels.get(result.call_id, result.name),
                         "content": result.content, "is_error": result.is_error,
                         "notice": result.notice or None,
                         "elapsed_ms": round(event.elapsed_ms, 3)})
        elif isinstance(event, Thinking):
            if not self.hide_thinking:
                self._write({"event": "thinking", "text": event.text})
        elif isinstance(event, Token):
            self._remote_text += event.text
            self._write({"event": "token", "text": event.text, "id": event.token_id})
        elif isinstance(event, PrefillProgress):
            self._write({"event": "prefill", "done": event.done, "total": event.total})
        elif isinstance(event, RouteChanged):
            if event.route == "remote" and self._remote_text:
                self._superseded = self._remote_text
                self._write({"event": "superseded", "text": self._superseded,
                             "reason": event.message})
            if event.route == "local":
                # Token text since the escalation was the remote's: a reader must drop it.
                self._write({"event": "retract", "text": self._remote_text,
                             "reason": event.message})
                if self._superseded:
                    self._write({"event": "restore", "text": self._superseded})
            # Token text since the change; a restored reply counts as such text.
            self._remote_text = self._superseded if event.route == "local" else ""
            # On the wire a route change stays the notice it always was.
            kind = "escalate" if event.route == "remote" else "fallback"
            self._write({"event": "notice", "kind": kind, "message": event.message})
        elif isinstance(event, Notice):
            self._write({"event": "notice", "kind": event.kind, "message": event.message})
        elif isinstance(event, Done):
            unread = _unread(self._remote_text, event.answer) if event.finish_reason == "aborted" else ""
            if unread:
                self._write({"event": "token", "text": unread, "id": -1})
            done = {"event": "done", "finish_reason": event.finish_reason,
                    "route": event.timings.route, "route_reason": event.timings.route_reason,
                    "timings": event.timings.to_dict()}
            if self.answer_format is not None:
                self.shape_problem = answer_shape.verdict(self.answer_format, event)
                done["format"] = {"name": self.answer_format.name,
                                  "complete": self.shape_problem is None,
                                  "problem": self.shape_problem}
            self._write(done)
        elif isinstance(event, Failed):
            self._write({"event": "error", "message": event.message})

    def error(self, message: str, code: int = 1) -> int:
        self._write({"event": "error", "message": message})
        return code


def summary_line(t: Timings) -> str:
    parts = [f"TTFT {t.ttft_ms:.0f} ms"]
    if t.thinking_n:
        answer = f"answer {t.time_to_answer_ms / 1000:.1f} s" if t.time_to_answer_ms else "no answer"
        parts.append(f"{answer} after {t.thinking_n} tok of thinking")
    parts.append(f"TPOT {t.tpot_ms:.1f} ms")
    if t.predicted_per_second:
        parts.append(f"{t.predicted_n} tokens at {t.predicted_per_second:.1f} tok/s")
    if t.draft_n:
        parts.append(f"drafted {t.draft_n}, {t.draft_n_accepted} accepted "
                     f"({100 * t.draft_n_accepted / t.draft_n:.0f}%)")
    parts.append(f"prompt {t.prompt_n} tok in {t.prompt_ms:.0f} ms, {t.cache_n} cached")
    parts.append(f"context {t.n_ctx_used}/{t.n_ctx}")
    if t.restore_ms:
        parts.append(f"restored in {t.restore_ms:.0f} ms")
    if t.images_n:
        parts.append(f"{t.images_n} image{'s' if t.images_n != 1 else ''} encoded in "
                     f"{t.image_ms:.0f} ms")
    if t.trimmed_n:
        parts.append(f"trimmed {t.trimmed_n} tok")
    if t.route != "local":
        parts.append(f"route {t.route}" + (f" ({t.route_reason})" if t.route_reason else ""))
    return " · ".join(parts)
