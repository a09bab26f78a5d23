"""The app's side of a turn's tool calls: each call shown as it is made, the user asked before
one runs, its result folded under it, and the notices the tools have for the user.

The chat layer's tool rounds (``chat.tool_rounds``) run the calls on the turn's worker thread and reports them as events
(``ToolCalled``, ``ToolApproval``, ``ToolReturned``; ``localchat.events``); ``Turns`` hands them
here on the UI thread. A ``ToolApproval`` puts an :class:`~localchat.tui.approval.ApprovalScreen`
up and answers its request when the user decides; the loop, which waits on the request, then
runs the call or tells the model it was denied. Nothing here waits: the UI keeps drawing.

A question still open when the turn stops (Esc on the chat, Ctrl+C, quitting, leaving the
session) is answered "deny", so the loop never waits on a screen that is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.events import ApprovalQuestion, Decision, ToolApproval, ToolCalled, ToolReturned
from localchat.tui.approval import ApprovalScreen
from localchat.tui.tool_calls import ToolCallView

if TYPE_CHECKING:
    from localchat.tui.host import Host
    from localchat.tui.reply_view import ReplyView


@dataclass
class OpenQuestion:
    request: ApprovalQuestion
    screen: ApprovalScreen
    view: ToolCallView | None


class ToolActivity:
    """Tool events of the turn in flight, on screen (see the module)."""

    def __init__(self, host: Host) -> None:
        self._host = host
        self._questions: list[OpenQuestion] = []

    @property
    def asking(self) -> bool:
        """Whether a question about a call is on screen."""
        return bool(self._questions)

    async def show(self, reply: ReplyView | None,
                   event: ToolCalled | ToolApproval | ToolReturned) -> None:
        host = self._host
        if isinstance(event, ToolCalled):
            host.set_state(f"calling {event.label}")
            if reply is not None:
                view = ToolCallView(event.call, event.label)
                await reply.add_call(view)
                if event.call.runnable:
                    view.running()
        elif isinstance(event, ToolApproval):
            asked = reply.call_view(event.call.id) if reply is not None else None
            self.ask(event, asked)
        else:
            returned = reply.call_view(event.call.id) if reply is not None else None
            if returned is not None:
                returned.show_result(event.result, event.elapsed_ms)
            if event.result.notice:
                host.notify(event.result.notice, severity="warning" if event.result.is_error
                            else "information")
            host.set_state("prefilling")

    def ask(self, event: ToolApproval, view: ToolCallView | None) -> None:
        request = event.request
        if request.future.done():
            return
        screen = ApprovalScreen(request)
        question = OpenQuestion(request, screen, view)
        self._questions.append(question)
        if view is not None:
            view.asking()
        self._host.set_state("waiting for your answer")

        def answered(decision: Decision | None) -> None:
            self._answer(question, decision or Decision.DENY)

        self._host.push_screen(screen, answered)

    def _answer(self, question: OpenQuestion, decision: Decision) -> None:
        if question in self._questions:
            self._questions.remove(question)
        if question.request.future.done():
            return
        notice = question.request.answer(decision)
        if question.view is not None:
            question.view.answered(decision.allows)
        self._host.set_state("running tool" if decision.allows else "prefilling")
        if notice:
            self._host.notify(notice)

    def deny_open_questions(self) -> None:
        """The turn is stopping or gone: every open question is answered "deny" and its screen
        taken down, so that the tool rounds never wait on it."""
        for question in list(self._questions):
            self._answer(question, Decision.DENY)
            if self._host.screen is question.screen:
                self._host.pop_screen()
