"""Loading and switching models in the app, off the UI thread. Mixed into ``LocalChatApp``.

A switch (``/model X``) checks X first (it is known, downloaded, and its GGUF has a chat template
that compiles) while the current model keeps working; only then is the current model closed (two
models at once may not fit in memory) and X loaded. If loading X still fails, the previous model
is loaded again, so a bad pick never leaves the app without a model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from textual import work

from localchat.errors import UserError
from localchat.tui.messages import ModelFailed, ModelLoading, ModelReady

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.tui.app import LocalChatApp

log = logging.getLogger(__name__)


class ModelLoader:
    # Set here as well as by the app.
    engine: Engine | None
    loading_model: str | None
    model_ref_loaded: str | None
    def load_model(self: LocalChatApp, model_ref: str | None) -> None:
        """Load ``model_ref`` off the UI thread; the model in use stays until ``model_ref`` is
        known to be loadable, and comes back if loading it fails."""
        self.loading_model = model_ref or "default model"
        self.set_state("loading model")
        self._load_in_background(model_ref, self.model_ref_loaded)

    def _release_engine(self: LocalChatApp) -> Engine | None:
        """Detach the current engine from the UI (called on the UI thread before it closes)."""
        previous, self.engine = self.engine, None
        if self.conversation is not None:
            self.conversation.chat = None
        return previous

    @work(thread=True, group="model", exit_on_error=False)
    def _load_in_background(self: LocalChatApp, model_ref: str | None, previous_ref: str | None) -> None:
        label = model_ref or "default model"
        try:
            sampling = self._sampling_factory()
            engine = self._engine_factory(model_ref)  # a name that is not downloaded stops here
            engine.preflight()  # and a GGUF without a usable chat template (or n_ctx) here
        except UserError as exc:
            self.post_message(ModelFailed(label, str(exc), kept=self.engine is not None, model_ref=model_ref))
            return
        previous = self.call_from_thread(self._release_engine)
        if previous is not None:
            previous.close()  # free its memory before the next model takes its share
        try:
            def progress(fraction: float) -> None:
                self.post_message(ModelLoading(engine.name, fraction))

            loaded = engine.load(on_progress=progress)
        except Exception as exc:  # out of memory, a corrupt file: shown as a notice, not a traceback
            if not isinstance(exc, UserError):
                log.exception("loading %s failed", label)
            message = str(exc) if isinstance(exc, UserError) else f"could not load {label}: {exc}"
            if previous is not None and not self._closed:
                self.post_message(ModelFailed(label, message, kept=True))
                self.call_from_thread(self._load_in_background, previous_ref, previous_ref)  # the old one back
            else:
                self.post_message(ModelFailed(label, message))
            return
        if self._closed:  # the user quit while it loaded
            engine.close()
            return
        self.post_message(ModelReady(engine, loaded, sampling, model_ref))

    def on_model_loading(self: LocalChatApp, message: ModelLoading) -> None:
        self.status.info.model = message.model
        self.set_state(f"loading {message.fraction:.0%}")

    async def on_model_ready(self: LocalChatApp, message: ModelReady) -> None:
        await self.chat_log.clear_notices()  # an earlier "model not loaded" no longer applies
        self.withdraw_notices("model")
        self.engine, self.loading_model, self.model_error = message.engine, None, ""
        self.model_ref_loaded = message.model_ref
        self.sampling = message.sampling
        if self.thinking_mode:  # /think outlives a model switch
            from localchat.engine.options import Sampling

            self.sampling = self.sampling or Sampling()
            self.sampling.thinking = self.thinking_mode
        self.status.info.show_loaded(message.loaded)
        self.set_state("idle")
        if self.conversation is not None:
            self.conversation.attach(self.engine, self.sampling)
        await self.send_next_queued()

    async def on_model_failed(self: LocalChatApp, message: ModelFailed) -> None:
        if message.kept:  # the model in use (or the one coming back) stays
            self.notify(f"{message.message}. Keeping {self.status.info.model or 'the current model'}.",
                        title="Model not switched", severity="error", timeout=15)
            if self.engine is not None:
                self.loading_model = None
                self.set_state("idle")
            return
        self.loading_model, self.model_error = None, message.message
        self.status.info.model = message.model
        self.set_state("no model")
        if self.offer_download(message.model_ref):  # not downloaded: offered here, no need to quit
            return
        await self.drop_queued("No model is loaded, so it was not sent.")
        await self.chat_log.add_notice(f"{message.message}. Pick another with /model NAME.")
        self.notify(message.message, title="Model not loaded", severity="error", timeout=15, cause="model")
