"""The open session as the screen shows it: its turns in the log (forked prompts marked with
their versions), its numbers in the status bar, its label over the input, and the sidebar's
list. Functions of the app (``Host``), for every part that changes what the session holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localchat.errors import UserError
from localchat.store import TurnRecord, branches

if TYPE_CHECKING:
    from localchat.chat.conversation import Conversation
    from localchat.tui.host import Host


def require(host: Host) -> Conversation:
    """The open session's conversation; raises ``UserError`` when none is open."""
    if host.conversation is None:
        raise UserError("No session is open.")
    return host.conversation


async def show_conversation(host: Host) -> None:
    """Show the open session's turns, forked prompts marked with their versions."""
    conversation = require(host)
    forks = {seq: (b.current, b.count)
             for seq, b in branches.fork_points(host.store, conversation.session_id).items()}
    await host.chat_log.show_turns(conversation.turns(), forks)


def show_numbers(host: Host, turns: list[TurnRecord]) -> None:
    """The status bar shows the open session: its last reply's numbers and the context it
    filled (0 for an empty or cleared one), never those of the session shown before."""
    info = host.status.info
    last = next((t.timings for t in reversed(turns) if t.role == "assistant" and t.timings), None)
    n_ctx = info.n_ctx  # the loaded model's, whatever model the session used before
    info.ttft_ms = info.answer_ms = info.tpot_ms = info.tokens_per_s = info.cache_n = info.prompt_n = None
    info.n_ctx_used = 0
    if last is not None:
        info.show_timings(last)
        info.n_ctx = n_ctx or info.n_ctx
    host.status.refresh()


def refresh_sidebar(host: Host) -> None:
    """Show the store's current session list and title (after any change to either)."""
    current = host.conversation.session_id if host.conversation else None
    try:
        if host.sidebar.display:
            # Empty sessions left by a crash or another window are not worth a line.
            sessions = [r for r in host.store.list_sessions()
                        if r.turn_count or r.name or r.system or r.id == current]
            host.sidebar.show(sessions, current)
        if host.conversation is not None:
            host.prompt.border_title = host.conversation.record.label
    except UserError as exc:  # the database is locked by another process or unreadable
        host.notify(str(exc), severity="error")
