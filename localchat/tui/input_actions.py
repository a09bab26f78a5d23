"""The input's helpers (completion hints, model names, PageUp/PageDown, help) and the app's
toasts. Mixed into ``LocalChatApp``, which keeps layout, turns and streaming."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work
from textual.notifications import Notification, Notify

from localchat.tui import slash
from localchat.tui.attach import path_completions
from localchat.tui.prompt import CommandHints, PromptInput
from localchat.tui.screens import HelpScreen

if TYPE_CHECKING:
    from localchat.tui.app import LocalChatApp


class Notices:
    def notify(self: LocalChatApp, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = False, cause: str = "") -> None:
        """Toasts show plain text: error messages and names carry brackets such as [remote]
        that Textual would otherwise read as markup. A toast with a ``cause`` ("model", "turn")
        is withdrawn by ``withdraw_notices`` when that cause is gone (the model loaded, a turn
        succeeded), instead of lingering for its whole timeout."""
        notification = Notification(message, title, severity,  # type: ignore[arg-type]
                                    self.NOTIFICATION_TIMEOUT if timeout is None else timeout, markup=markup)
        if cause:
            self._notices_by_cause.setdefault(cause, []).append(notification)
        self.post_message(Notify(notification))

    def withdraw_notices(self: LocalChatApp, cause: str) -> None:
        for notification in self._notices_by_cause.pop(cause, []):
            if notification in self._notifications:
                self._unnotify(notification)


class InputActions:
    _typing_model: bool  # the input starts with /model (model names are re-read)
    def on_prompt_input_page_key(self: LocalChatApp, message: PromptInput.PageKey) -> None:
        log_view = self.chat_log
        log_view.scroll_page_up() if message.direction < 0 else log_view.scroll_page_down()

    def action_help(self: LocalChatApp) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def _completions(self: LocalChatApp, text: str) -> list[slash.Completion]:
        return slash.completions(text, self._model_choices) or path_completions(text)

    def on_text_area_changed(self: LocalChatApp, event: PromptInput.Changed) -> None:
        text = event.text_area.text
        self.query_one(CommandHints).show(self._completions(text))
        typing_model = text.startswith("/model")
        if typing_model and not self._typing_model:
            self._fetch_model_names()  # `localchat import` or `pull` may have run since
        self._typing_model = typing_model
        self.schedule_draft_prefill(text)

    @work(thread=True, group="registry", exit_on_error=False)
    def _fetch_model_names(self: LocalChatApp) -> None:
        choices = self._list_models()
        self.call_from_thread(self._show_model_choices, choices)

    def _show_model_choices(self: LocalChatApp, choices: list[tuple[str, bool]]) -> None:
        self._model_choices = choices
        if self._typing_model:
            self.query_one(CommandHints).show(self._completions(self.prompt.text))
