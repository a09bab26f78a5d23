"""Which idle slot a new request takes: the one whose cells keep the most of it (the exact
prefix its records share with the request, as ``state_pool.StateView.kept`` reckons it), then an
empty one, then the one used least recently (its conversation is the likeliest to be over; the
engine saves it to the RAM pool before it is overwritten). Plain logic: tested without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localchat.engine.state_pool import StateView, Wanted


@dataclass(frozen=True)
class SlotState:
    seq: int
    view: StateView
    last_used: float  # time.monotonic() when its last turn ended (0: never used)


def choose_slot(idle: Sequence[SlotState], wanted: Wanted) -> SlotState:
    """The slot of ``idle`` (not empty) for a turn that wants ``wanted``."""
    if not idle:
        raise ValueError("no idle slot to choose from")

    def rank(slot: SlotState) -> tuple[int, bool, float]:
        return slot.view.kept(wanted), slot.view.n_tokens == 0, -slot.last_used

    return max(idle, key=rank)
