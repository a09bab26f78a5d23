"""The app's side of prefill while typing (``localchat.context.draft``): hand the draft to the
session's ``DraftPrefill`` after a short pause in typing, at once after a paste, and at least
every ``TYPING_MAX_WAIT_S`` while typing goes on without a pause (a fast typist, or a paste a
terminal delivers as separate key presses). Never while a reply streams, a model loads or the
input holds a command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from localchat.errors import UserError
from localchat.tui.prompt import is_command, message_text

if TYPE_CHECKING:
    from textual.timer import Timer

    from localchat.tui.attached_files import AttachedFiles
    from localchat.tui.host import Host

# A pause this long ends a burst of typing (a keystroke every 100-250 ms keeps it waiting).
TYPING_PAUSE_S = 0.3
# A change this large in one event is a paste: prefill starts at once.
PASTE_CHARS = 40
# Typing without a pause still hands the draft over this often: steps only add what is new.
TYPING_MAX_WAIT_S = 1.0
_clock = time.monotonic  # tests replace it


class DraftHandOver:
    """When the draft in the input is handed to the open session's ``DraftPrefill`` (which
    prefills it, step by step)."""

    def __init__(self, host: Host, files: AttachedFiles, busy: Callable[[], bool]) -> None:
        self._host = host
        self._files = files
        self._busy = busy  # a reply streams or messages wait to be sent: no draft then
        self._timer: Timer | None = None
        self._seen = ""
        self._waiting_since: float | None = None  # the first change not yet handed over

    def schedule(self, text: str) -> None:
        """The input changed to ``text``."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        pasted = abs(len(text) - len(self._seen)) >= PASTE_CHARS
        self._seen = text
        now = _clock()
        if self._waiting_since is None:
            self._waiting_since = now
        if pasted or now - self._waiting_since >= TYPING_MAX_WAIT_S:
            self._prefill()
        else:
            self._timer = self._host.set_timer(TYPING_PAUSE_S, self._prefill)

    def _prefill(self) -> None:
        self._timer = None
        self._waiting_since = None
        host = self._host
        chat = host.conversation.chat if host.conversation is not None else None
        if chat is None or host.closed or not host.is_running:
            return
        text = host.prompt.text
        attachments = self._files.attachments
        # Its pictures' bytes, as the message will carry them: encoded while the words are typed.
        images = tuple(image.data for image in self._files.images)
        if (not text.strip() and not attachments and not images) or is_command(text) or self._busy():
            chat.draft.cancel()
            return
        # As it will be sent (attached and @mentioned files first), so that Enter reuses it all.
        # Off the event loop: that reads the files, and sizing a step tokenizes the draft,
        # which a long paste would make keypresses wait for.
        outgoing = self._files.outgoing(message_text(text), draft=True)

        def update() -> None:
            try:
                draft = outgoing()
            except UserError:  # a file that cannot go: Enter will say so; nothing to prefill
                chat.draft.cancel()
                return
            chat.draft.update(draft, images)

        host.run_worker(update, thread=True, group="draft", exit_on_error=False)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._waiting_since = None
        conversation = self._host.conversation
        chat = conversation.chat if conversation is not None else None
        if chat is not None:
            chat.draft.cancel()
