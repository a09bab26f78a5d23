"""Actions on any message of the conversation, with the keyboard.

Alt+Up (or Ctrl+Up) in the input selects the newest message; in the conversation Up/Down move
the selection, ``c`` copies the message, ``1``–``9`` copy a reply's code block N, ``e`` edits a
prompt of yours (Enter resends it: the conversation forks there, the old branch stays), ←/→ show
the other versions of a forked prompt, Esc goes back to the input. Ctrl+E writes the input in
``$EDITOR``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import SuspendNotSupported

from localchat.chat.conversation import code_blocks
from localchat.errors import UserError
from localchat.reply.reasoning import strip_reasoning
from localchat.store import branches
from localchat.tui.chat_log import ChatLog, ReplyView, UserMessage
from localchat.tui.session_view import refresh_sidebar, require, show_conversation, show_numbers

if TYPE_CHECKING:
    from localchat.store.images import ImageFile
    from localchat.tui.host import Host
    from localchat.tui.turn import Turns
    from localchat.tui.typeahead import TypeAhead


class MessageActions:
    """Actions on the messages on screen, and the edit of an earlier prompt in progress."""

    def __init__(self, host: Host, turns: Turns, queue: TypeAhead) -> None:
        self._host = host
        self._turns = turns
        self._queue = queue
        self.editing: int | None = None  # index among the prompts on screen of the one being edited

    def select_messages(self) -> None:
        self._host.chat_log.focus()
        self._host.chat_log.action_select(0)

    async def act(self, event: ChatLog.Action) -> None:
        try:
            await self._message_action(event)
        except UserError as exc:
            self._host.notify(str(exc), severity="error")

    async def _message_action(self, event: ChatLog.Action) -> None:
        message = event.message
        if event.action == "leave" or message is None:
            self._host.prompt.focus()
            return
        if event.action == "copy":
            self._host.copy_text(message.text if isinstance(message, UserMessage) else strip_reasoning(message.text))
        elif event.action == "code":
            blocks = code_blocks(message.text) if isinstance(message, ReplyView) else []
            if not blocks:
                raise UserError("Select a reply with a code block to copy it (1 is its first block).")
            if event.number > len(blocks):
                raise UserError(f"This reply has {len(blocks)} code block{'s' if len(blocks) > 1 else ''}.")
            self._host.copy_text(blocks[event.number - 1])
        elif isinstance(message, UserMessage) and event.action == "edit":
            self._start_edit(message)
        elif isinstance(message, UserMessage) and event.action in ("older", "newer"):
            await self._switch_version(message, -1 if event.action == "older" else 1)

    def _prompt_seq(self, message: UserMessage) -> int:
        """The stored seq of a prompt on screen: as read from the store, or for a prompt sent
        since, by position (the n-th prompt is the n-th user turn)."""
        if message.seq is not None:
            return message.seq
        index = self._host.chat_log.prompts().index(message)
        users = [t for t in require(self._host).turns() if t.role == "user"]
        if index >= len(users):
            raise UserError("That message is not saved yet.")
        return users[index].seq

    def _start_edit(self, message: UserMessage) -> None:
        if self._turns.current is not None or self._queue.items:
            raise UserError("Wait for the reply (or press Esc) before editing an earlier message.")
        self.editing = self._host.chat_log.prompts().index(message)
        self._host.prompt.text = message.text
        self._host.prompt.move_cursor(self._host.prompt.document.end)
        self._host.prompt.border_title = "Editing: Enter resends from this message (the old branch stays) · Esc cancels"
        self._host.prompt.focus()

    def cancel_edit(self) -> None:
        self.editing = None
        self._host.prompt.clear()
        refresh_sidebar(self._host)  # the title back to the session's label

    async def send_edited(self, text: str, images: tuple[ImageFile, ...] = ()) -> None:
        """Resend an edited prompt (with the pictures it had, then ``images``, those attached
        since): the turns from it on become a branch, the model's cache keeps exactly the cells
        before it, and only the edited message is prefilled."""
        index, self.editing = self.editing, None
        assert index is not None  # only called while editing
        conversation = require(self._host)
        seq = self._prompt_seq(self._host.chat_log.prompts()[index])
        edited = next((t for t in conversation.turns() if t.seq == seq), None)
        had = conversation.stored_images(edited) if edited is not None else ()
        conversation.fork_at(seq)
        await show_conversation(self._host)
        refresh_sidebar(self._host)
        await self._turns.send(text, images=(*had, *images))
        self.mark_new_version(seq)

    def mark_new_version(self, seq: int) -> None:
        """The prompt just sent at fork ``seq`` is its newest version: say so on screen."""
        versions = branches.branches_at(self._host.store, require(self._host).session_id, seq)
        prompts = self._host.chat_log.prompts()
        if prompts:
            prompts[-1].show_versions(versions.count - 1, versions.count)

    async def _switch_version(self, message: UserMessage, step: int) -> None:
        if self._turns.current is not None:
            raise UserError("Wait for the reply (or press Esc) before switching versions.")
        index = self._host.chat_log.prompts().index(message)
        if not require(self._host).switch_branch(self._prompt_seq(message), step):
            raise UserError("No other version of this message." if step else "")
        await show_conversation(self._host)
        prompts = self._host.chat_log.prompts()
        self._host.chat_log.select(prompts[min(index, len(prompts) - 1)] if prompts else None)
        show_numbers(self._host, require(self._host).turns())

    def toggle_thinking(self) -> None:
        """Ctrl+T: open or fold the reasoning blocks of every reply (remembered)."""
        show = not self._host.chat_log.show_thinking
        self._host.chat_log.set_show_thinking(show)
        self._host.save_setting("show_thinking", "yes" if show else "no")

    def external_editor(self) -> None:
        """Ctrl+E: write the input in $EDITOR (VISUAL, EDITOR, else vi); the text comes back."""
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "message.md"
            path.write_text(self._host.prompt.text, encoding="utf-8")
            command = [*shlex.split(editor), str(path)]
            try:
                try:
                    with self._host.suspend():  # the editor gets the terminal until it exits
                        subprocess.run(command, check=False)
                except SuspendNotSupported:  # no terminal to hand over (headless): a GUI editor may still run
                    subprocess.run(command, check=False, stdin=subprocess.DEVNULL)
            except (OSError, ValueError) as exc:
                self._host.notify(f"Could not run {editor}: {exc}", severity="error")
                return
            self._host.prompt.text = path.read_text(encoding="utf-8", errors="replace").rstrip("\n")
        self._host.prompt.move_cursor(self._host.prompt.document.end)
        self._host.prompt.focus()
