"""RoutedTurn: a turn that the escalator may hand to the remote model, seen through the same
interface as a local TurnHandle, so the session records whichever reply won before the final
event reaches the reader."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from localchat.events import Done, Event, Failed


class RoutedTurn:
    def __init__(self, turn, on_finish: Callable[[Done | Failed], None]) -> None:
        self._turn = turn  # an EscalatedTurn
        self._on_finish = on_finish
        self._stopped = threading.Event()
        self._finished = threading.Event()
        self.result: Done | Failed | None = None

    @property
    def outcome(self):
        """Who answered and why (TurnOutcome), once the turn has ended."""
        return self._turn.outcome

    def __iter__(self) -> Iterator[Event]:
        for event in self._turn:
            if isinstance(event, (Done, Failed)):
                self.result = event
                self._on_finish(event)
                self._finished.set()
            yield event

    def stop(self) -> None:
        self._stopped.set()
        self._turn.stop()

    def on_finish(self, callback: Callable[[Done | Failed], None]) -> None:
        previous = self._on_finish

        def both(event: Done | Failed) -> None:
            previous(event)
            callback(event)

        self._on_finish = both

    @property
    def stop_requested(self) -> bool:
        return self._stopped.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()
