"""One message too long for the context: refuse it with the numbers, or keep its head and tail.

A message "cannot fit" when it does not fit even in an empty context, that is next to the system
prompt alone with the reply reserve kept free. What happens then is the user's choice
(``ContextSettings.overlong``), and it is always visible: a refusal that gives the numbers, or a
cut whose marker sits in the message the user and the model both see. Never a silent cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, overload

from localchat.settings import OverlongPolicy

# Tokens budgeted for the cut marker when the caller has not measured it. "[… 12,345 tokens cut …]"
# on its own line is 10-14 tokens with common BPE vocabularies; 16 leaves slack.
DEFAULT_MARKER_TOKENS = 16
# Fewer kept tokens than this would be a marker with almost nothing around it: refuse instead.
MIN_KEPT_TOKENS = 2


class OverlongSettings(Protocol):
    """The context settings an oversized message is judged by (``budget.ContextSettings`` has
    them): the context size, the reply reserve, the user's policy and the cut marker's text."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def reply_reserve(self) -> int: ...

    @property
    def overlong(self) -> OverlongPolicy: ...

    @property
    def overlong_marker(self) -> str:
        """The marker's text; ``{cut}`` in it stands for the number of tokens cut."""
        ...


@dataclass(frozen=True)
class OverlongDecision:
    """What to do with a message too long for the context, with the numbers behind it.

    ``available_tokens`` is the most a message may take: ``n_ctx`` minus the system prompt, the
    reply reserve and the template tokens around the message. For "head_tail", keep the first
    ``keep_head`` and last ``keep_tail`` tokens around a marker of ``marker_tokens`` tokens.
    """

    action: OverlongPolicy
    message_tokens: int
    available_tokens: int
    n_ctx: int
    system_tokens: int
    reply_reserve: int
    keep_head: int = 0
    keep_tail: int = 0
    marker_tokens: int = 0

    @property
    def cut_tokens(self) -> int:
        """Tokens of the message that will not be seen (the whole message when refused)."""
        return self.message_tokens - self.keep_head - self.keep_tail

    @property
    def message(self) -> str:
        """One line for the user: what happened and the numbers."""
        numbers = (
            f"the message is {self.message_tokens:,} tokens; the context holds {self.n_ctx:,}, of which "
            f"{self.system_tokens:,} are the system prompt and {self.reply_reserve:,} are kept for "
            f"the reply, so a message can use at most {max(self.available_tokens, 0):,}"
        )
        if self.action == "head_tail":
            return (
                f"Message shortened: {numbers}. Kept the first {self.keep_head:,} and the last "
                f"{self.keep_tail:,} tokens; {self.cut_tokens:,} tokens in the middle were cut."
            )
        return (
            f"Message too long: {numbers}. "
            'Shorten it, or set overlong = "head_tail" to keep its start and end.'
        )


def overlong_message(
    settings: OverlongSettings,
    system_tokens: int,
    message_tokens: int,
    *,
    overhead_tokens: int = 0,
    marker_tokens: int = DEFAULT_MARKER_TOKENS,
) -> OverlongDecision | None:
    """The decision for a message of ``message_tokens`` (its text alone; ``overhead_tokens`` are
    the template tokens around it), or None when it fits next to the system prompt alone.

    With the "head_tail" policy the kept tokens plus ``marker_tokens`` equal exactly what is
    available; head and tail share it equally (the tail gets the odd token: a pasted text's
    question usually comes last). When even that leaves fewer than ``MIN_KEPT_TOKENS`` the
    message is refused whatever the policy.
    """
    available = settings.n_ctx - settings.reply_reserve - system_tokens - overhead_tokens
    if message_tokens <= available:
        return None
    numbers = dict(
        message_tokens=message_tokens,
        available_tokens=available,
        n_ctx=settings.n_ctx,
        system_tokens=system_tokens,
        reply_reserve=settings.reply_reserve,
    )
    keep = available - marker_tokens
    if settings.overlong == "head_tail" and keep >= MIN_KEPT_TOKENS:
        head = keep // 2
        return OverlongDecision(
            "head_tail", **numbers, keep_head=head, keep_tail=keep - head, marker_tokens=marker_tokens
        )
    return OverlongDecision("refuse", **numbers)


def marker_text(settings: OverlongSettings, cut_tokens: int) -> str:
    """The visible marker for a cut of ``cut_tokens`` tokens, on its own line.

    Tokenize this text to learn ``marker_tokens``; measuring it with the message's full length
    gives an upper bound, since the real cut is shorter and so has no more digits.
    """
    return "\n" + settings.overlong_marker.replace("{cut}", f"{cut_tokens:,}") + "\n"


@overload
def head_tail_cut(content: str, keep_head: int, keep_tail: int, marker: str) -> str: ...
@overload
def head_tail_cut(
    content: Sequence[int], keep_head: int, keep_tail: int, marker: Sequence[int]
) -> list[int]: ...


def head_tail_cut(content, keep_head, keep_tail, marker):
    """``content`` with its middle replaced by ``marker``: the first ``keep_head`` and the last
    ``keep_tail`` items are kept. Content no longer than both together is returned unchanged
    (no marker: nothing was cut).

    Works on token ids (what the local engine needs: counts are exact) or on text (counts are
    characters, e.g. for display or a remote). Lossy by design in the middle, and possibly at
    the two seams: a token cut can split a word, or a character whose UTF-8 bytes span several
    tokens (decode the result with errors="replace"); a text cut can split a combining sequence.
    """
    if keep_head < 0 or keep_tail < 0:
        raise ValueError(f"keep counts must be >= 0, got head={keep_head} tail={keep_tail}")
    if keep_head + keep_tail >= len(content):
        return content if isinstance(content, str) else list(content)
    head, tail = content[:keep_head], content[len(content) - keep_tail :]
    if isinstance(content, str):
        return head + marker + tail
    return [*head, *marker, *tail]
