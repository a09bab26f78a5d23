"""``localchat ask``: one turn from the command line, streamed to stdout as tokens arrive."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, TextIO

from localchat.commands import answer_shape
from localchat.errors import FormatError
from localchat.events import (
    Done,
    Event,
    Failed,
    Notice,
    PrefillProgress,
    RouteChanged,
    Thinking,
    Timings,
    Token,
    Turn,
)
from localchat.terminal import raw, visible

if TYPE_CHECKING:
    from localchat.chat.conversation import Conversation
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling
    from localchat.formats import AnswerFormat
    from localchat.remote.escalate import Escalator, Route
    from localchat.settings import Settings

EXIT_INTERRUPTED = 130


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ask",
        help="answer one prompt, streamed to stdout",
        description="Answer one prompt with the local model, streaming tokens to stdout and a "
        "timings summary to stderr. Ctrl+C stops the reply (exit status 130).",
    )
    p.add_argument("prompt", nargs="?", default=None, help="the prompt; '-' or nothing reads stdin")
    p.add_argument("--model", "-m", help="registry name, hf:ORG/REPO/FILE.gguf or a .gguf path")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int, help="most tokens to generate")
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--seed", type=int, help="sampling seed")
    p.add_argument("--n-ctx", type=int, help="context size in tokens")
    p.add_argument("--json", action="store_true", help="JSON Lines events on stdout")
    p.add_argument("--file", "-f", action="append", default=[], metavar="PATH",
                   help="attach a text file to the question (repeatable)")
    p.add_argument("--session", "-s", help="continue the stored session with this id or name (a new name starts one)")
    p.add_argument("--think", choices=("on", "off", "auto"),
                   help="the model's thinking switch, for templates that have one (Qwen3 style)")
    p.add_argument("--hide-thinking", action="store_true",
                   help="drop the model's reasoning; print only the answer")
    p.add_argument("--speculative", choices=("auto", "ngram", "draft", "off"),
                   help="speculative decoding: drafted tokens checked in one decode (default: "
                   "[engine] speculative, off)")
    p.add_argument("--draft-model", help="the draft model for speculative decoding (registry "
                   "name, hf: reference or .gguf path)")
    p.add_argument("--route", choices=("local", "remote", "auto"),
                   help="who answers: the local model, the configured remote, or decide by rules "
                   "and confidence (default: auto when [remote] is on, else local)")
    answer_shape.add_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localchat.attachments import read_attachment
    from localchat.chat.escalation import Escalation
    from localchat.context.factory import open_chat
    from localchat.engine.factory import open_engine, sampling_options
    from localchat.engine.options import shaped
    from localchat.errors import UserError
    from localchat.remote.escalate import Escalator
    from localchat.settings import load_config

    out: PlainText | JsonEvents = (JsonEvents(sys.stdout, args.hide_thinking) if args.json
                                   else PlainText(sys.stdout, sys.stderr, args.hide_thinking))
    try:
        check_flags(args)
        shape = out.answer_format = answer_shape.answer_format(args)
        prompt, notice = read_prompt(args.prompt)
        if notice:
            out.event(notice)
        for path in args.file:  # a missing or binary file is refused before a model loads
            read_attachment(path, None, None)
        config = load_config()
        escalator = Escalator.from_settings(config.remote)
        route: Route = args.route or ("auto" if escalator.client is not None else "local")
        overrides = {"n_ctx": args.n_ctx or None, "speculative": args.speculative,
                     "draft_model": args.draft_model}
        if shape is not None and not shape.is_json and route == "remote":
            raise FormatError("--grammar is followed by the local model only: it cannot be sent "
                              "to the remote (--route remote)")
        engine = open_engine(args.model, config, **overrides)
        sampling = shaped(sampling_options(config, **_sampling_flags(args)), shape)
        engine.load()
        if shape is not None and not shape.is_json:
            engine.check_grammar(shape.grammar)  # token names (<|im_end|>) need the vocabulary
        prompt = _with_files(prompt, args.file, engine, sampling)
        if args.n_ctx and engine.n_ctx != args.n_ctx:
            out.event(Notice(f"n_ctx {args.n_ctx} was rounded up to {engine.n_ctx} "
                             "(llama.cpp allocates contexts in steps of 256 tokens)", kind="n_ctx"))
        if sampling.thinking != "auto" and not engine.supports_thinking:
            out.event(Notice(f"{engine.name} has no thinking switch; --think {sampling.thinking} "
                             "is ignored", kind="thinking"))
    except UserError as exc:
        return out.error(str(exc), exc.exit_code)
    try:
        with _stored_conversation(args.session, engine, config, args.system, sampling, out,
                                  escalator) as conversation:
            chat = conversation.chat if conversation is not None else None
            if chat is None:
                chat = open_chat(engine, config, system=args.system, sampling=sampling)
            before = len(chat.history)
            router = Escalation(escalator, engine, route) if route != "local" else None
            handle = chat.send(prompt, router=router)
            # The message as the context policy sent it (it may have cut an over-long one);
            # stored together with its reply. None: refused, nothing was sent.
            sent = chat.history[before].content if len(chat.history) > before else None
            final, user_stopped = stream(handle, out)
            if conversation is not None and sent is not None and isinstance(final, Done):
                conversation.record_exchange(sent, final, engine.name)
                for notice in conversation.take_notices():
                    out.event(notice)
    except UserError as exc:
        return out.error(str(exc), exc.exit_code)
    finally:
        engine.close()
        escalator.close()
    if isinstance(final, Failed):
        return 1
    # Only the user's Ctrl+C is an interruption: a local reply cut by a hand-over to a remote
    # that then failed is the answer kept (the fallback notice said so).
    if user_stopped and final.finish_reason == "aborted":
        return EXIT_INTERRUPTED
    return 1 if out.shape_problem is not None else 0


def _with_files(prompt: str, paths: list[str], engine, sampling) -> str:
    """The question as it will be sent, with the ``-f`` files (and ``@path`` mentions) attached,
    as the app sends a message; UserError for a binary or over-long file."""
    from pathlib import Path

    from localchat.attachments import outgoing_message
    from localchat.context.budget import message_room

    return outgoing_message(prompt, [], Path.cwd(), files=paths, count_tokens=engine.count_tokens,
                            room=message_room(engine.n_ctx, sampling.max_tokens))


@contextmanager
def _stored_conversation(name: str | None, engine: Engine, config: Settings, system: str | None,
                         sampling: Sampling, out: PlainText | JsonEvents,
                         escalator: Escalator) -> Iterator[Conversation | None]:
    """``--session NAME``: the conversation comes from (and goes back to) the store the app uses,
    and its KV cache is restored from the last snapshot instead of being prefilled again. None
    without a name.

    The session's lock is held from reading the history to storing the reply: it serialises
    turns of one session across processes (a second ``ask --session`` waits, then sees the
    first's turn)."""
    if name is None:
        yield None
        return
    from localchat.chat.conversation import Conversation
    from localchat.chat.services import ChatServices, session_snapshots
    from localchat.errors import UserError
    from localchat.store import Store
    from localchat.store.locks import SessionLock
    from localchat.store.store import SessionNotFound

    with Store.open() as store:
        while True:
            record, started = store.start_or_resolve(name)
            lock = SessionLock(record.id)
            waiting = Notice(f"session {record.label!r} is answering in another localchat; "
                             "waiting for it", kind="waiting")
            lock.acquire(on_wait=lambda: out.event(waiting))  # noqa: B023 - called before the next pass
            try:  # read again under the lock: the ask that held it may have removed it
                record = store.session(record.id)
                break
            except SessionNotFound:
                lock.release()
        try:
            services = ChatServices(config, session_snapshots(config), lambda: escalator)
            conversation = Conversation(store, record, services)
            if system is not None and system != record.system:
                conversation.set_system(system)
            conversation.attach(engine, sampling)
            conversation.restore_snapshot()
            for notice in conversation.take_notices():
                out.event(notice)
            yield conversation
        finally:
            # A session this ask started is not left behind empty by a refused or failed turn.
            if started:
                with suppress(UserError):  # a full disk: it stays, listed with no turns
                    store.forget_if_empty(record.id)
            lock.release()


def _sampling_flags(args: argparse.Namespace) -> dict:
    flags = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
             "thinking": args.think}
    return {k: v for k, v in flags.items() if v is not None}


def check_flags(args: argparse.Namespace) -> None:
    """Refuse flag values that would be silently changed or make no sense (one-line UserError)."""
    from localchat.engine.runtime import check_n_ctx_floor
    from localchat.settings import check_flag
    from localchat.store.store import check_session_name

    check_flag("--max-tokens", "sampling.max_tokens", args.max_tokens)
    check_flag("--temperature", "sampling.temperature", args.temperature)
    if args.n_ctx is not None:
        check_n_ctx_floor(args.n_ctx, "--n-ctx")
    if args.session is not None:
        check_session_name(args.session)


def read_prompt(prompt: str | None) -> tuple[str, Notice | None]:
    """The prompt, and a notice when stdin was not valid UTF-8 (its bad bytes become U+FFFD:
    lone surrogates would otherwise reach the tokenizer and fail there)."""
    from localchat.errors import UserError

    notice = None
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError("no prompt: give one as an argument, or pipe it on stdin with '-'")
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
        prompt = data if isinstance(data, str) else data.decode("utf-8", errors="surrogateescape")
    # Undecodable bytes (from stdin or argv) arrive as lone surrogates.
    if any("\ud800" <= ch <= "\udfff" for ch in prompt):
        raw = prompt.encode("utf-8", "surrogateescape" if _escaped_only(prompt) else "surrogatepass")
        prompt = raw.decode("utf-8", errors="replace")
        notice = Notice("the prompt is not valid UTF-8: undecodable bytes were replaced by �",
                        kind="input")
    if not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt, notice


def _escaped_only(text: str) -> bool:
    return all(not "\ud800" <= ch <= "\udfff" or "\udc80" <= ch <= "\udcff" for ch in text)


def stream(handle: Turn, out: PlainText | JsonEvents) -> tuple[Done | Failed, bool]:
    """Write each event as it arrives; Ctrl+C stops the reply instead of killing the process.
    The turn's final event, and whether Ctrl+C stopped it."""

    def on_interrupt(*_: object) -> None:
        out.user_stopped = True  # before the stop, so the final event finds it set
        handle.stop()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        for event in handle:
            out.event(event)
        final = handle.result
        assert final is not None, "a turn's events end with its final one"
        return final, out.user_stopped
    finally:
        signal.signal(signal.SIGINT, previous)


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
        self.user_stopped = False  # Ctrl+C stopped the turn (set by ``stream``)
        # A shaped answer is held back and written whole at the end, on stdout only when it is
        # complete and of its shape (``answer_shape.verdict``), else on stderr with why not.
        self.answer_format: AnswerFormat | None = None
        self.shape_problem: str | None = None

    def _write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def event(self, event: Event) -> None:
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
        """Reasoning goes to stderr, dimmed on a terminal, so stdout holds only the answer."""
        stderr = raw(self.stderr)  # the dimming escapes are ours; the model's text is not
        if stderr.isatty():
            text = f"\x1b[2m{visible(text)}\x1b[22m"
        stderr.write(text)
        stderr.flush()
        self._thinking_open = True


class JsonEvents:
    """One JSON object per line: thinking, token, prefill, notice, superseded, retract, restore,
    done, error. The token texts not voided always add up to the reply kept:

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
        self.user_stopped = False  # Ctrl+C stopped the turn (set by ``stream``)
        self.answer_format: AnswerFormat | None = None  # the done event says if the answer has it
        self.shape_problem: str | None = None

    def _write(self, obj: dict) -> None:
        self.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.stdout.flush()

    def event(self, event: Event) -> None:
        if isinstance(event, Thinking):
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
    if t.trimmed_n:
        parts.append(f"trimmed {t.trimmed_n} tok")
    if t.route != "local":
        parts.append(f"route {t.route}" + (f" ({t.route_reason})" if t.route_reason else ""))
    return " · ".join(parts)
