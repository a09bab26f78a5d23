"""``localchat ask``: one turn from the command line, streamed to stdout as tokens arrive."""

from __future__ import annotations

import argparse
import io
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from localchat.commands import answer_shape, ask_images, ask_tools
from localchat.commands.ask_output import JsonEvents, PlainText
from localchat.ending import ENDING_SIGNALS, Ended, detach_lost_terminal, exit_status, handled
from localchat.errors import FormatError
from localchat.events import Done, Failed, Notice, Turn

if TYPE_CHECKING:
    from localchat.chat.conversation import Conversation
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling
    from localchat.remote.escalate import Escalator, Route
    from localchat.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ask",
        help="answer one prompt, streamed to stdout",
        description="Answer one prompt with the local model, streaming tokens to stdout and a "
        "timings summary to stderr. Ctrl+C stops the reply (exit status 130); so do SIGTERM "
        "and SIGHUP (143 and 129), and the reply so far is kept.",
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
    ask_images.add_flags(p)
    answer_shape.add_flags(p)
    ask_tools.add_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = (JsonEvents(sys.stdout, args.hide_thinking) if args.json
           else PlainText(sys.stdout, sys.stderr, args.hide_thinking))
    with Interruptions(out) as interruptions:
        return _answer(args, out, interruptions)


def _answer(args: argparse.Namespace, out: PlainText | JsonEvents,
            interruptions: Interruptions) -> int:
    from localchat.attachments import mentioned_files, read_attachment
    from localchat.chat import tool_rounds
    from localchat.chat.escalation import Escalation
    from localchat.chat.tools import ChatTools
    from localchat.context.factory import open_chat
    from localchat.engine.factory import open_engine, sampling_options
    from localchat.engine.options import shaped
    from localchat.errors import UserError
    from localchat.remote.escalate import Escalator
    from localchat.settings import load_config

    tools = ChatTools.empty()
    try:
        check_flags(args)
        shape = out.answer_format = answer_shape.answer_format(args)
        prompt, notice = read_prompt(args.prompt)
        if notice:
            out.event(notice)
        # A missing or binary file is refused before a model loads; one read up to a cut
        # character says so.
        for path in [*args.file, *mentioned_files(prompt, Path.cwd())]:
            note = read_attachment(path, None, None).note
            if note:
                out.event(Notice(note, kind="input"))
        images, notices = ask_images.read_images(args.image)
        for notice in notices:
            out.event(notice)
        config = load_config()
        if images:
            ask_images.check_route(args.route, config.remote)
        if images and args.route != "remote":  # a forced remote turn never falls back to local
            ask_images.check_model(args.model, config.default_model)
        tools = ChatTools.open(config, args.allow_tool)  # servers start while the model loads
        for problem in tools.problems:
            out.event(Notice(problem, kind="tools"))
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
        tools.close()
        return out.error(str(exc), exc.exit_code)
    approver = out.approve = ask_tools.Approver()
    try:
        with _stored_conversation(args.session, engine, config, args.system, sampling, out,
                                  escalator) as conversation:
            chat = conversation.chat if conversation is not None else None
            if chat is None:
                chat = open_chat(engine, config, system=args.system, sampling=sampling)
            before = len(chat.history)
            router = Escalation(escalator, engine, route) if route != "local" else None
            handle = tool_rounds.start(chat, prompt, tools, tool_choice=args.tool_choice,
                                     router=router, images=tuple(i.data for i in images))
            # The message as the context policy sent it (it may have cut an over-long one);
            # stored together with its reply. None: refused, nothing was sent.
            sent = chat.history[before].content if len(chat.history) > before else None
            final = interruptions.stream(handle)
            if conversation is not None and sent is not None and isinstance(final, Done):
                rounds = handle.rounds if isinstance(handle, tool_rounds.ToolTurn) else []
                conversation.record_exchange(sent, final, engine.name, rounds, images)
                for notice in conversation.take_notices():
                    out.event(notice)
    except UserError as exc:
        return out.error(str(exc), exc.exit_code)
    finally:
        engine.close()
        escalator.close()
        tools.close()
        approver.close()
    return interruptions.status(final)


def _with_files(prompt: str, paths: list[str], engine, sampling) -> str:
    """The question as it will be sent, with the ``-f`` files (and ``@path`` mentions) attached,
    as the app sends a message; UserError for a binary or over-long file."""
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
    from localchat.chat.tools import check_tool_choice
    from localchat.engine.runtime import check_n_ctx_floor
    from localchat.settings import check_flag
    from localchat.store.store import check_session_name

    check_flag("--max-tokens", "sampling.max_tokens", args.max_tokens)
    check_flag("--temperature", "sampling.temperature", args.temperature)
    check_tool_choice(args.tool_choice)
    if args.n_ctx is not None:
        check_n_ctx_floor(args.n_ctx, "--n-ctx")
    if args.session is not None:
        check_session_name(args.session)


def read_prompt(prompt: str | None) -> tuple[str, Notice | None]:
    """The prompt, and a notice when stdin was not valid UTF-8 (its bad bytes become U+FFFD:
    lone surrogates would otherwise reach the tokenizer and fail there)."""
    from localchat.errors import UserError
    from localchat.user_files import read_capped

    notice = None
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError("no prompt: give one as an argument, or pipe it on stdin with '-'")
        data = read_capped(_stdin_bytes(), "stdin", "send a smaller prompt")
        prompt = data.decode("utf-8", errors="surrogateescape")
    # Undecodable bytes (from stdin or argv) arrive as lone surrogates.
    if any("\ud800" <= ch <= "\udfff" for ch in prompt):
        raw = prompt.encode("utf-8", "surrogateescape" if _escaped_only(prompt) else "surrogatepass")
        prompt = raw.decode("utf-8", errors="replace")
        notice = Notice("the prompt is not valid UTF-8: undecodable bytes were replaced by �",
                        kind="input")
    if not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt, notice


def _stdin_bytes() -> BinaryIO:
    """stdin as bytes (a text stream with no buffer, as some embedders set, read up to the cap)."""
    from localchat.user_files import MAX_BYTES

    stdin = sys.stdin
    if hasattr(stdin, "buffer"):
        return stdin.buffer
    return io.BytesIO(stdin.read(MAX_BYTES + 1).encode("utf-8", "surrogateescape"))


def _escaped_only(text: str) -> bool:
    return all(not "\ud800" <= ch <= "\udfff" or "\udc80" <= ch <= "\udcff" for ch in text)


class Interruptions:
    """Ctrl+C, SIGTERM and SIGHUP while ``ask`` runs (``localchat.ending``), in three phases:

    - before the turn starts, they end the command at once (KeyboardInterrupt for Ctrl+C,
      ``Ended`` for the others): nothing is there to keep yet, and the ``finally`` blocks on the
      way out release the session and forget one this ask started;
    - while the reply streams, they stop it: it is printed and stored, marked stopped;
    - once it has ended, they wait: storing the reply and saving its context are not cut.

    ``signum`` is the first that came (None: none came). After SIGHUP, output that went to the
    terminal which was closed goes to /dev/null, so that writing it cannot fail the turn."""

    def __init__(self, out: PlainText | JsonEvents) -> None:
        self.signum: int | None = None
        self._out = out
        self._turn: Turn | None = None
        self._holding = False  # the turn has ended: a signal now waits for the reply to be kept
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interruptions:
        for signum in handled((signal.SIGINT, *ENDING_SIGNALS)):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def status(self, final: Done | Failed) -> int:
        """The exit status for a turn that ended with ``final``: a signal's when it stopped the
        reply (a local reply cut by a hand-over to a remote that then failed is the answer kept,
        not an interruption)."""
        if isinstance(final, Failed):
            return 1
        if self.signum is not None and self._out.user_stopped and final.finish_reason == "aborted":
            return exit_status(self.signum)
        return 1 if self._out.shape_problem is not None else 0

    def stream(self, handle: Turn) -> Done | Failed:
        """Write each event of ``handle`` as it arrives; the turn's final event. A signal now
        stops the reply instead of ending the process."""
        self._turn = handle
        try:
            for event in handle:
                try:
                    self._out.event(event)
                except OSError:
                    if not detach_lost_terminal():
                        raise
                    # The terminal hung up and SIGHUP did not come (ignored: nohup): as if it had.
                    self._on_signal(signal.SIGHUP, None)
            final = handle.result
            assert final is not None, "a turn's events end with its final one"
            return final
        finally:
            self._turn = None
            self._holding = True

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum != signal.SIGINT:
            detach_lost_terminal()
        if self.signum is None:
            self.signum = signum
        if self._turn is not None:
            self._out.user_stopped = True  # before the stop, so the final event finds it set
            self._turn.stop()
        elif not self._holding:
            raise KeyboardInterrupt if signum == signal.SIGINT else Ended(signum)
