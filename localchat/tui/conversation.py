"""A conversation as the app handles it: one stored session plus, once a model is ready, the
``ChatSession`` that continues it.

The store is the record of what the user saw; the chat session is what the model sees. Every
change goes to both so they never disagree: a prompt is committed before its turn starts, a
reply (stopped or not) the moment the turn ends. Nothing here touches the screen, so it is safe
to call from the generation thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from localchat.errors import UserError
from localchat.events import Done, Notice
from localchat.reasoning import strip_reasoning
from localchat.session.chat import ChatSession, Message
from localchat.store import SessionRecord, Store, TurnRecord, branches, export
from localchat.store.locks import SessionLock

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.options import Sampling
    from localchat.engine.turn import TurnHandle
    from localchat.tui.model_setup import ChatServices

_CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


class Conversation:
    def __init__(self, store: Store, session: SessionRecord, services: ChatServices | None = None) -> None:
        self.store = store
        self.session_id = session.id
        self.services = services
        self.chat: ChatSession | None = None
        self._restore_pending = False
        self._notices: list[Notice] = []
        self._escalator = None  # made on the first turn; lives as long as the session is open

    def __repr__(self) -> str:
        return f"Conversation(session_id={self.session_id}, attached={self.chat is not None})"

    @property
    def record(self) -> SessionRecord:
        return self.store.session(self.session_id)

    def turns(self) -> list[TurnRecord]:
        return self.store.turns(self.session_id)

    def attach(self, engine: Engine, sampling: Sampling | None = None) -> None:
        """Give the conversation a loaded model: the chat session starts from the stored turns.
        With a real engine the context budget applies, and the session's saved KV cache is
        restored just before its first turn (so that turn's TTFT shows what reopening costs)."""
        record = self.record
        history = [Message(t.role, t.content, stopped=t.stopped) for t in self.turns()]
        if self.services is not None and hasattr(engine, "export_snapshot"):
            from localchat.session.factory import open_chat

            self.chat = open_chat(engine, self.services.config, system=record.system,
                                  history=history, sampling=sampling)
            self._restore_pending = bool(history)
        else:
            self.chat = ChatSession(engine, system=record.system, history=history, sampling=sampling)
            self.chat.summary = record.summary

    @contextmanager
    def turn_lock(self) -> Iterator[None]:
        """Hold the session's lock across processes for one turn, from reading its history to
        storing the reply: an ``ask --session`` on it meanwhile waits for this turn, and while
        such a run holds it this one is refused. Turns another process stored since this
        session was opened are loaded first, so no reply is generated without them."""
        lock = SessionLock(self.session_id)
        if not lock.try_acquire():
            raise UserError("This session is answering in another localchat process; "
                            "send again when it is done.")
        try:
            chat = self.chat
            if chat is not None and len(self.turns()) != len(chat.history):
                self.attach(chat.engine, chat.sampling)
            yield
        finally:
            lock.release()

    def send(self, text: str, route: str = "auto") -> TurnHandle:
        """Start the model's turn and commit the prompt as sent (the context policy may have cut
        an over-long one; a refused one is not stored). Requires ``attach``."""
        chat = self._require_chat()
        if self._restore_pending:
            self._restore_pending = False
            restored = self.services.snapshots.restore(self.session_id, chat.engine, chat)
            if restored.notice:
                self._notices.append(Notice(restored.notice, kind="snapshot"))
        if self._escalator is None and self.services is not None:
            self._escalator = self.services.new_escalator()
        escalator = self._escalator
        routed = escalator is not None and (escalator.client is not None or route == "remote")
        before = len(chat.history)
        handle = chat.send(text, escalator=escalator if routed else None, route=route)
        if len(chat.history) > before:
            self.store.add_user_turn(self.session_id, chat.history[before].content)
        return handle

    def close(self) -> None:
        """The session is left: release its connection to the remote, if it made one."""
        if self._escalator is not None:
            self._escalator.close()
            self._escalator = None

    def take_notices(self) -> list[Notice]:
        """Notices about the last send (e.g. a saved context that had to be rebuilt, or one
        that could not be saved after the previous reply)."""
        store = self.services.snapshots.store if self.services is not None else None
        failure = store.take_notice() if store is not None else None
        if failure:
            self._notices.append(Notice(failure, kind="snapshot"))
        notices, self._notices = self._notices, []
        return notices

    def record_reply(self, done: Done, model: str) -> TurnRecord:
        """Commit a finished turn's reply; an aborted one is stored as stopped. If the commit
        fails (disk full, database locked) the reply is forgotten by the model too, so the turn
        ends like a failed one (the prompt stays) and no later turn builds on a lost reply."""
        timings = done.timings
        try:
            turn = self.store.add_reply(
                self.session_id,
                done.reply,
                model=timings.model or model,
                timings=timings,
                finish_reason=done.finish_reason,
                stopped=done.finish_reason == "aborted",
                route=timings.route,
                route_reason=timings.route_reason,
            )
        except UserError as exc:
            self._forget_last_reply()
            raise UserError(f"{exc} The reply was not saved.") from None
        # Trimming may have swapped in a new running summary during the turn.
        if self.chat is not None and self.chat.summary != self.record.summary:
            self.store.set_summary(self.session_id, self.chat.summary)
        if self.services is not None and self.chat is not None and hasattr(self.chat.engine, "export_snapshot"):
            # Off the UI thread (this runs on the turn's worker); the file is written by a thread.
            self.services.snapshots.save(self.session_id, self.chat.engine, self.chat)
        return turn

    def _forget_last_reply(self) -> None:
        chat = self.chat
        if chat is None or not chat.history or chat.history[-1].role != "assistant":
            return
        # The KV cache still holds the reply, but the next turn's history no longer continues
        # it, so the engine drops those cells and keeps the exact prefix before them.
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

    def _resync(self) -> None:
        """The model's history becomes the turns now on screen (the store's)."""
        chat = self.chat
        if chat is None:
            return
        history = [Message(t.role, t.content, stopped=t.stopped) for t in self.turns()]
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
            if turn.role == "assistant" and strip_reasoning(turn.content):
                return strip_reasoning(turn.content)  # the answer, without the model's reasoning
        raise UserError("There is no reply to copy yet.")

    def last_code_block(self) -> str:
        """The last fenced code block of the latest reply that has one."""
        for turn in reversed(self.turns()):
            blocks = code_blocks(turn.content) if turn.role == "assistant" else []
            if blocks:
                return blocks[-1]
        raise UserError("No reply in this session contains a code block.")

    def to_markdown(self) -> str:
        """The session as a Markdown document (``/export``)."""
        return export.to_markdown(self.store, self.session_id)

    def to_json(self) -> str:
        """The session as JSON (``/export FILE.json``)."""
        return export.to_json(self.store, self.session_id)

    def _require_chat(self) -> ChatSession:
        if self.chat is None:
            raise UserError("The model is not loaded yet.")
        return self.chat


def code_blocks(reply: str) -> list[str]:
    """The fenced code blocks of a reply's answer (not its reasoning), in order."""
    return [block.rstrip("\n") for block in _CODE_BLOCK.findall(strip_reasoning(reply))]
