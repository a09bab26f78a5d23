"""A conversation: one stored session plus, once a model is ready, the ``ChatContext`` that
continues it. The app and ``ask --session`` both go through it.

The store is the record of what the user saw; the chat session is what the model sees. Every
change goes to both so they never disagree. The app commits a prompt before its turn starts and
the reply (stopped or not) the moment the turn ends (``send``, ``record_reply``); ``ask``, a
process that may be stopped at any point, commits both in one transaction (``record_exchange``).
A reply that cannot be stored is forgotten by the model too.

With the services, the context budget applies and, unless ``[snapshots] enabled = false``, the
session's KV cache is saved after each reply and restored before its first turn. Nothing here
touches the screen, so it is safe to call from the generation thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

from localchat.chat import tool_rounds
from localchat.chat.escalation import Escalation
from localchat.chat.snapshots import SnapshotEngine
from localchat.context.chat_context import ChatContext
from localchat.context.keeper import ContextEngine
from localchat.context.message import Message
from localchat.errors import UserError
from localchat.events import Done, Failed, Notice, Timings, Turn
from localchat.reply.reasoning import strip_reasoning
from localchat.store import SessionRecord, Store, StoreError, TurnRecord, branches, export
from localchat.store.images import ImageFile
from localchat.store.locks import SessionLock

if TYPE_CHECKING:
    from localchat.chat.services import ChatServices
    from localchat.chat.snapshots import SessionSnapshots
    from localchat.chat.tool_rounds import RoundMessage
    from localchat.engine.options import Sampling
    from localchat.remote.escalate import Escalator, Route

ROUTES = ("auto", "local", "remote")
_CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


class ChatEngine(ContextEngine, SnapshotEngine, Protocol):
    """What a stored conversation needs from its engine: turns within a kept context, and the
    session's KV cache saved and restored."""


class Conversation:
    def __init__(self, store: Store, session: SessionRecord,
                 services: ChatServices | None = None) -> None:
        self.store = store
        self.session_id = session.id
        self.services = services
        self.chat: ChatContext | None = None
        self._engine: ChatEngine | None = None
        self._restore_pending = False
        self._notices: list[Notice] = []
        self._escalator: Escalator | None = None  # made on the first turn; closed by close()
        # What a turn asks of the model when the services have tools: "auto", "none",
        # "required" or a tool's name (the app's setting, for the turns that follow).
        self.tool_choice = "auto"
        self._rounds: list[RoundMessage] = []  # the running turn's tool rounds, stored with its reply

    def __repr__(self) -> str:
        return f"Conversation(session_id={self.session_id}, attached={self.chat is not None})"

    @property
    def record(self) -> SessionRecord:
        return self.store.session(self.session_id)

    def turns(self) -> list[TurnRecord]:
        return self.store.turns(self.session_id)

    def attach(self, engine: ChatEngine, sampling: Sampling | None = None) -> None:
        """Give the conversation a loaded model: the chat session starts from the stored turns.
        With the services the context budget applies, and the session's saved cache is restored
        just before its first turn (``restore_snapshot``: that turn's TTFT shows what reopening
        costs)."""
        record = self.record
        history = self._stored_history()
        self._engine = engine
        if self.services is not None:
            from localchat.context.factory import open_chat

            self.chat = open_chat(engine, self.services.config, system=record.system,
                                  history=history, sampling=sampling)
            # The summary and the window come back with the saved cache, or the policy decides.
            self._restore_pending = bool(history) and self._snapshots is not None
        else:
            self.chat = ChatContext(engine, system=record.system, history=history, sampling=sampling)
            self.chat.summary = record.summary
            self._restore_pending = False
        if self.services is not None and self.services.tools is not None:
            self.chat.next_tools = self._tools_now

    def _tools_now(self) -> tuple[dict[str, Any], ...]:
        """The tools the next message would offer as things stand (never waiting for a server)."""
        tools = self.services.tools if self.services is not None else None
        if tools is None or self.tool_choice == "none" or self.chat is None:
            return ()
        return tools.offer(self.chat.sampling, "auto").tools

    @property
    def _snapshots(self) -> SessionSnapshots | None:
        """The snapshot service, when this session's KV cache is saved and restored."""
        if self.services is None or self._engine is None:
            return None
        return self.services.snapshots

    def restore_snapshot(self) -> None:
        """Load the session's saved KV cache into the engine now, if ``attach`` left that to
        do (a cache that cannot be used is rebuilt by the next turn's prefill, with a notice)."""
        snapshots, chat, engine = self._snapshots, self.chat, self._engine
        if not self._restore_pending or snapshots is None or chat is None or engine is None:
            return
        self._restore_pending = False
        restored = snapshots.restore(self.session_id, engine, chat)
        if restored.notice:
            self._notices.append(Notice(restored.notice, kind="snapshot"))

    @contextmanager
    def turn_lock(self) -> Iterator[list[TurnRecord]]:
        """Hold the session's lock across processes for one turn, from reading its history to
        storing the reply: an ``ask --session`` on it meanwhile waits for this turn, and while
        such a run holds it this one is refused. Turns another process stored since this
        session was opened are loaded first, so no reply is generated without them; the block
        receives them (usually none), for the screen to show before this turn's reply."""
        lock = SessionLock(self.session_id)
        if not lock.try_acquire():
            raise UserError("This session is answering in another localchat process; "
                            "send again when it is done.")
        try:
            arrived: list[TurnRecord] = []
            chat = self.chat
            if chat is not None and self._engine is not None \
                    and self.record.turn_count != len(chat.history):
                stored = self.turns()
                known = len(chat.history)
                if [self._message(t) for t in stored[:known]] == chat.history:
                    arrived = stored[known:]  # appended by another process (an ``ask -s``)
                self.attach(self._engine, chat.sampling)
            yield arrived
        finally:
            lock.release()

    def send(self, text: str, route: str = "auto", images: Sequence[ImageFile] = ()) -> Turn:
        """Start the model's turn and commit the prompt as sent (the context policy may have cut
        an over-long one; a refused one is not stored), with its pictures (``images``: stored
        before the prompt that names them). ``route``: "auto", "local" or "remote". Requires
        ``attach``."""
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}")
        chat = self._require_chat()
        self.restore_snapshot()
        if self._escalator is None and self.services is not None:
            self._escalator = self.services.new_escalator()
        escalator = self._escalator
        routed = escalator is not None and (escalator.client is not None or route == "remote")
        before = len(chat.history)
        router = (Escalation(escalator, chat.engine, cast("Route", route))
                  if escalator is not None and routed else None)
        tools = self.services.tools if self.services is not None else None
        pictures = tuple(image.data for image in images)
        if tools is not None:
            handle = tool_rounds.start(chat, text, tools, tool_choice=self.tool_choice, router=router,
                                       images=pictures)
        else:
            handle = chat.send(text, router=router, images=pictures)
        if len(chat.history) > before:
            self.store.add_user_turn(self.session_id, chat.history[before].content, images)
        self._rounds = handle.rounds if isinstance(handle, tool_rounds.ToolTurn) else []
        if isinstance(handle, tool_rounds.ToolTurn):
            handle.on_finish(self._keep_rounds_of_failed_turn)
        return handle

    def _keep_rounds_of_failed_turn(self, final: Done | Failed) -> None:
        """A turn that failed after tool rounds: the calls ran and the model saw the results,
        so they are stored as the history holds them (the next turn goes on after them)."""
        if isinstance(final, Failed) and self._rounds:
            rounds, self._rounds = self._rounds, []
            try:
                with self.store.batch():
                    store_rounds(self.store, self.session_id, rounds, "")
            except UserError:
                self._forget_rounds(rounds)

    def close(self) -> None:
        """The session is left: release its connection to the remote, if it made one."""
        if self._escalator is not None:
            self._escalator.close()
            self._escalator = None

    def take_notices(self) -> list[Notice]:
        """Notices about the last turn (e.g. a saved context that had to be rebuilt, or one
        that could not be saved after the previous reply)."""
        snapshots = self._snapshots
        failure = snapshots.store.take_notice() if snapshots is not None else None
        if failure:
            self._notices.append(Notice(failure, kind="snapshot"))
        notices, self._notices = self._notices, []
        return notices

    def record_reply(self, done: Done, model: str) -> TurnRecord:
        """Commit a finished turn's reply (its prompt was committed by ``send``); an aborted one
        is stored as stopped. If the commit fails (disk full, database locked) the reply is
        forgotten by the model too, so the turn ends like a failed one (the prompt stays) and no
        later turn builds on a lost reply. Then the KV cache is saved, off this thread."""
        rounds, self._rounds = self._rounds, []
        try:
            with self.store.batch():
                store_rounds(self.store, self.session_id, rounds, model)
                turn = self.store.add_reply(self.session_id, done.reply,
                                            **_reply_fields(done, model))
        except UserError as exc:
            self._forget_last_reply()
            self._forget_rounds(rounds)
            raise UserError(f"{exc} The reply was not saved.") from None
        # Trimming may have swapped in a new running summary during the turn.
        if self.chat is not None and self.chat.summary != self.record.summary:
            self.store.set_summary(self.session_id, self.chat.summary)
        self._save_snapshot(wait=False)
        return turn

    def record_exchange(self, prompt: str, done: Done, model: str,
                        rounds: list[RoundMessage] | tuple[()] = (),
                        images: Sequence[ImageFile] = ()) -> TurnRecord:
        """Commit ``prompt`` (as sent), its tool ``rounds`` (``ToolTurn.rounds``), its reply and
        the running summary in one transaction (all or none), then save the KV cache, which then
        holds exactly what the store does, and wait for the file. Raises ``UserError`` when the
        store cannot take them."""
        chat = self._require_chat()
        try:
            with self.store.batch():
                self.store.add_user_turn(self.session_id, prompt, images)
                store_rounds(self.store, self.session_id, list(rounds), model)
                turn = self.store.add_reply(self.session_id, done.reply,
                                            **_reply_fields(done, model))
                self.store.set_summary(self.session_id, chat.summary)
        except StoreError as exc:
            self._forget_last_reply()
            self._forget_rounds(list(rounds))
            raise StoreError(f"{exc} Neither the prompt nor the reply was saved.") from None
        self._save_snapshot(wait=True)
        return turn

    def _save_snapshot(self, *, wait: bool) -> None:
        # The copy out of llama.cpp runs on the engine thread; the file is written by a thread.
        snapshots, chat, engine = self._snapshots, self.chat, self._engine
        if snapshots is not None and chat is not None and engine is not None:
            snapshots.save(self.session_id, engine, chat, wait=wait)

    def _forget_last_reply(self) -> None:
        chat = self.chat
        if chat is None or not chat.history or chat.history[-1].role != "assistant":
            return
        # The KV cache still holds the reply, but the next turn's history no longer continues
        # it, so the engine drops those cells and keeps the exact prefix before them.
        chat.history.pop()

    def _forget_rounds(self, rounds: list[RoundMessage]) -> None:
        """Tool rounds the store could not take leave the model's history too (they are its
        last messages, after the prompt)."""
        chat = self.chat
        if chat is None or not rounds:
            return
        with chat.state_lock:
            for message in reversed([r.message for r in rounds]):
                if chat.history and chat.history[-1] is message:
                    chat.history.pop()

    def take_back_last_prompt(self) -> str:
        """``/retry``: the last prompt and its reply become a branch of their own (still
        reachable, ←/→ on the prompt); return the prompt, to be sent again."""
        last = self.last_prompt()
        self.fork_at(last.seq)
        return last.content

    def last_prompt(self) -> TurnRecord:
        """The newest prompt of the user. Raises ``UserError`` if there is none."""
        last = next((t for t in reversed(self.turns()) if t.role == "user"), None)
        if last is None:
            raise UserError("There is no earlier message to retry.")
        return last

    def fork_at(self, seq: int) -> None:
        """Set the turns from ``seq`` on aside as a branch (an edit or a retry writes the new
        ones); the model's history is cut there too, so the KV cache keeps exactly the cells
        before the fork and the next turn prefills only the new message."""
        branches.fork(self.store, self.session_id, seq)
        self._resync()

    def switch_branch(self, seq: int, step: int) -> bool:
        """Show the previous (-1) or next (+1) version from turn ``seq`` on."""
        if not branches.switch(self.store, self.session_id, seq, step):
            return False
        self._resync()
        return True

    def _stored_history(self) -> list[Message]:
        return [self._message(t) for t in self.turns()]

    def stored_images(self, turn: TurnRecord) -> tuple[ImageFile, ...]:
        """A stored prompt's pictures, to send again (a retry, an edit); one whose stored copy
        is gone is left out."""
        found = ((ref, self.store.image_bytes(ref)) for ref in turn.images)
        return tuple(ImageFile(ref, data) for ref, data in found if data is not None)

    def _message(self, turn: TurnRecord) -> Message:
        """A stored turn as the model's history holds it (with its calls, or as a tool result,
        or with its pictures' bytes: a picture whose stored copy is gone is left out, said once)."""
        images = []
        for ref in turn.images:
            data = self.store.image_bytes(ref)
            if data is None:
                self._notices.append(Notice(f"the picture {ref.name} of message {turn.seq} is no "
                                            "longer stored; the model no longer sees it",
                                            kind="input"))
            else:
                images.append(data)
        return Message(turn.role, turn.content, stopped=turn.stopped, tool_calls=turn.tool_calls,
                       tool_call_id=turn.tool_call_id, name=turn.tool_name, images=tuple(images))

    def _resync(self) -> None:
        """The model's history becomes the turns now on screen (the store's)."""
        chat = self.chat
        if chat is None:
            return
        history = self._stored_history()
        kept = 0
        while kept < min(len(history), len(chat.history)) and history[kept] == chat.history[kept]:
            kept += 1
        chat.rewind(kept)
        chat.history.extend(history[kept:])

    def clear(self) -> None:
        self.store.clear_turns(self.session_id)
        if self.chat is not None:
            self.chat.clear()

    def set_system(self, text: str) -> None:
        self.store.set_system(self.session_id, text)
        if self.chat is not None:
            self.chat.set_system(text)

    def rename(self, name: str) -> SessionRecord:
        return self.store.rename_session(self.session_id, name)

    @property
    def summary(self) -> str:
        return self.chat.summary if self.chat is not None else self.record.summary

    def last_reply(self) -> str:
        """The latest assistant reply. Raises ``UserError`` if there is none yet."""
        for turn in reversed(self.turns()):
            if turn.role == "assistant" and strip_reasoning(turn.answer):
                return strip_reasoning(turn.answer)  # the answer, without reasoning or calls
        raise UserError("There is no reply to copy yet.")

    def last_code_block(self) -> str:
        """The last fenced code block of the latest reply that has one."""
        for turn in reversed(self.turns()):
            blocks = code_blocks(turn.answer) if turn.role == "assistant" else []
            if blocks:
                return blocks[-1]
        raise UserError("No reply in this session contains a code block.")

    def to_markdown(self) -> str:
        """The session as a Markdown document (``/export``)."""
        return export.to_markdown(self.store, self.session_id)

    def to_json(self) -> str:
        """The session as JSON (``/export FILE.json``)."""
        return export.to_json(self.store, self.session_id)

    def _require_chat(self) -> ChatContext:
        if self.chat is None:
            raise UserError("The model is not loaded yet.")
        return self.chat


def store_rounds(store: Store, session_id: int, rounds: list[RoundMessage], model: str) -> None:
    """Write a turn's tool rounds (inside the caller's ``store.batch()``): each reply that
    called, with its calls, and each result. ``model``: the local model in charge."""
    for item in rounds:
        if item.result is not None:
            store.add_tool_result(session_id, item.result, label=item.label,
                                  elapsed_ms=item.elapsed_ms)
        elif item.done is not None:
            store.add_reply(session_id, item.message.content,
                            **_reply_fields(item.done, model or item.done.timings.model),
                            tool_calls=item.message.tool_calls)


class _ReplyFields(TypedDict):
    model: str
    timings: Timings
    finish_reason: str
    stopped: bool
    route: str
    route_reason: str
    local_model: str
    fell_back: bool


def _reply_fields(done: Done, model: str) -> _ReplyFields:
    """``Store.add_reply``'s keywords for a finished turn (an aborted one is stored as stopped);
    ``model`` is the local model's name, in charge of the turn whoever answered."""
    timings = done.timings
    return _ReplyFields(model=timings.model or model, timings=timings,
                        finish_reason=done.finish_reason, stopped=done.finish_reason == "aborted",
                        route=timings.route, route_reason=timings.route_reason, local_model=model,
                        fell_back=timings.fell_back)


def code_blocks(reply: str) -> list[str]:
    """The fenced code blocks of a reply's answer (not its reasoning), in order."""
    return [block.rstrip("\n") for block in _CODE_BLOCK.findall(strip_reasoning(reply))]
