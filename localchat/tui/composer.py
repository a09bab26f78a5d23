"""The composer: what Enter does with the input, and the completions offered while typing.

Completions: command names after ``/``, model names after ``/model ``, picture paths after
``/image ``, paths after ``@`` (Tab completes them), shown as hints under the input while typing.
A paste naming picture files attaches them (``take_paste``). Enter (``submit``) runs a command,
or sends the message with its files (``attached_files``), or resends the prompt being edited
(``message_actions``). Each change of the input is handed to the draft prefill (``draft``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.attachments import complete_path
from localchat.errors import UserError
from localchat.tui import slash_commands
from localchat.tui.attached_files import attached_notice
from localchat.tui.image_paths import pasted_image_paths
from localchat.tui.prompt import CommandHints, Completion, is_command, message_text

if TYPE_CHECKING:
    from localchat.tui.attached_files import AttachedFiles
    from localchat.tui.draft import DraftHandOver
    from localchat.tui.host import Host
    from localchat.tui.message_actions import MessageActions
    from localchat.tui.slash_commands import Commands
    from localchat.tui.turn import Turns


class Composer:
    """What the input is composing: the completions offered while typing (model names are
    re-read each time the input starts with ``/model``), and what Enter does with it."""

    def __init__(self, host: Host, list_models: Callable[[], list[tuple[str, bool]]], *,
                 commands: Commands, files: AttachedFiles, draft: DraftHandOver, turns: Turns,
                 message_actions: MessageActions) -> None:
        self._host = host
        self._list_models = list_models
        self._commands = commands
        self._files = files
        self._draft = draft
        self._turns = turns
        self._message_actions = message_actions
        self.model_choices: list[tuple[str, bool]] = []
        self._typing_model = False  # the input starts with /model (model names are re-read)

    async def submit(self, text: str) -> None:
        """Enter: run a command, or send the message (with its files; resent from the prompt
        being edited, if one is)."""
        host = self._host
        if is_command(text):
            if " " in text.strip():  # "/model qwen" is worth recalling; a bare "/retry" is not
                host.prompt.remember(text)
            host.prompt.clear()
            await self._commands.run(text)
            return
        typed = message_text(text)
        try:
            text, images = await self._files.message_with_files(typed)
        except UserError as exc:  # the message stays in the input
            host.notify(str(exc), severity="error")
            return
        if self._message_actions.editing is not None:
            await self._message_actions.send_edited(text, images)
        else:
            await self._turns.send(text, recall=typed, images=images)

    def take_paste(self, text: str) -> bool:
        """A paste (or a file dropped on the terminal) that names picture files attaches them
        instead of going into the input (as Ollama's CLI does); False: it is text."""
        if is_command(self._host.prompt.text):  # "/image " then a pasted path: its argument
            return False
        paths = pasted_image_paths(text, Path.cwd())
        if not paths:
            return False
        self._host.run_worker(self.attach_images(paths), group="attach", exit_on_error=False)
        return True

    async def attach_images(self, paths: list[Path]) -> None:
        """Attach pictures (``/image``, a paste); a bad one, or a model that reads none, is a
        one-line notice and nothing is attached."""
        try:
            images = await self._files.attach_images(paths)
        except UserError as exc:
            self._host.notify(str(exc), severity="error")
            return
        self._host.notify(attached_notice(images))
        self._draft.schedule(self._host.prompt.text)  # the pictures are encoded while typing

    def remove_last_image(self) -> None:
        """Backspace in the empty input: the last picture attached is removed."""
        image = self._files.remove_last_image()
        if image is not None:
            self._host.notify(f"Removed {image.ref.name}.")
            self._draft.schedule(self._host.prompt.text)

    # --- completions ------------------------------------------------------------------------

    def completions(self, text: str) -> list[Completion]:
        choices = slash_commands.Choices(self.model_choices)
        return slash_commands.completions(text, choices) or path_completions(text)

    def changed(self, text: str) -> None:
        """The input now reads ``text``: new hints, and the draft handed over in a while."""
        self._host.query_one(CommandHints).show(self.completions(text))
        typing_model = text.startswith("/model")
        if typing_model and not self._typing_model:
            self.fetch_model_names()  # `localchat import` or `pull` may have run since
        self._typing_model = typing_model
        self._draft.schedule(text)

    def fetch_model_names(self) -> None:
        self._host.run_worker(self._fetch_model_names, thread=True, group="registry", exit_on_error=False)

    def _fetch_model_names(self) -> None:
        choices = self._list_models()
        self._host.call_from_thread(self._show_model_choices, choices)

    def _show_model_choices(self, choices: list[tuple[str, bool]]) -> None:
        self.model_choices = choices
        if self._typing_model:
            self._host.query_one(CommandHints).show(self.completions(self._host.prompt.text))


def path_completions(text: str) -> list[Completion]:
    """After ``@`` at the end of the input: the paths it may go on to, as whole inputs."""
    head, _, word = text.rpartition(" ") if " " in text else ("", "", text)
    if not word.startswith("@") or "\n" in word:
        return []
    prefix = head + " " if head else ""
    return [Completion(f"{prefix}@{path}", path) for path in complete_path(word[1:] or "./")]
