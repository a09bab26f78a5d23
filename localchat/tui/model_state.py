"""The app's model: loading and switching it off the UI thread, and the state of both (``ModelState``).

A switch (``/model X``) checks X first (it is known, downloaded, and its GGUF has a chat template
that compiles) while the current model keeps working; only then is the current model closed (two
models at once may not fit in memory) and X loaded. If loading X still fails, the previous model
is loaded again, so a bad pick never leaves the app without a model.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from localchat.errors import UserError
from localchat.tui.app_engine import AppEngine, EngineFactory
from localchat.tui.messages import ModelFailed, ModelLoading, ModelReady

if TYPE_CHECKING:
    from localchat.engine.options import Sampling
    from localchat.formats import AnswerFormat
    from localchat.tui.host import Host


log = logging.getLogger(__name__)


class ModelState:
    """The model the app chats with, and the one on its way: every model field in one place.

    ``engine`` and ``sampling`` are the loaded model's (None until one is loaded); ``loading``
    names the model being loaded (None when none is); ``error`` says why none is loaded;
    ``thinking_mode`` is the ``/think`` choice ("" = the config's ``[sampling] thinking``), which
    outlives a model switch. The status bar's model name is only the display of these.
    """

    def __init__(self, host: Host, model_ref: str | None, engine_factory: EngineFactory,
                 sampling_factory: Callable[[], Sampling | None]) -> None:
        self._host = host
        self._engine_factory = engine_factory
        self._sampling_factory = sampling_factory
        # What the loaded model was called (``--model`` at start; reloaded if a switch fails).
        self.loaded_ref = model_ref
        self.engine: AppEngine | None = None
        self.sampling: Sampling | None = None
        self.thinking_mode = ""
        self.answer_format: AnswerFormat | None = None  # /format: the shape asked of answers
        self.loading: str | None = None
        self.error = ""

    def load(self, model_ref: str | None) -> None:
        """Load ``model_ref`` off the UI thread; the model in use stays until ``model_ref`` is
        known to be loadable, and comes back if loading it fails."""
        self.loading = model_ref or "default model"
        self._host.set_state("loading model")
        self._load_in_background(model_ref, self.loaded_ref)

    def switch(self, name: str) -> None:
        """``/model NAME`` (the caller has checked that no reply is streaming)."""
        if self.loading:
            raise UserError(f"{self.loading} is still loading; switch when it is ready.")
        self.load(name)

    def _release_engine(self) -> AppEngine | None:
        """Detach the current engine from the UI (called on the UI thread before it closes)."""
        previous, self.engine = self.engine, None
        if self._host.conversation is not None:
            self._host.conversation.chat = None
        return previous

    def _load_in_background(self, model_ref: str | None, previous_ref: str | None) -> None:
        self._host.run_worker(functools.partial(self._load, model_ref, previous_ref), thread=True,
                              group="model", exit_on_error=False)

    def _load(self, model_ref: str | None, previous_ref: str | None) -> None:
        host = self._host
        label = model_ref or "default model"
        try:
            sampling = self._sampling_factory()
            engine = self._engine_factory(model_ref)  # a name that is not downloaded stops here
            engine.preflight()  # and a GGUF without a usable chat template (or n_ctx) here
        except UserError as exc:
            host.post_message(ModelFailed(label, str(exc), kept=self.engine is not None, model_ref=model_ref))
            return
        previous = host.call_from_thread(self._release_engine)
        if previous is not None:
            previous.close()  # free its memory before the next model takes its share
        try:
            def progress(fraction: float) -> None:
                host.post_message(ModelLoading(engine.name, fraction))

            loaded = engine.load(on_progress=progress)
        except Exception as exc:  # out of memory, a corrupt file: shown as a notice, not a traceback
            if not isinstance(exc, UserError):
                log.exception("loading %s failed", label)
            message = str(exc) if isinstance(exc, UserError) else f"could not load {label}: {exc}"
            if previous is not None and not host.closed:
                host.post_message(ModelFailed(label, message, kept=True))
                host.call_from_thread(self._load_in_background, previous_ref, previous_ref)  # the old one back
            else:
                host.post_message(ModelFailed(label, message))
            return
        if host.closed:  # the user quit while it loaded
            engine.close()
            return
        host.post_message(ModelReady(engine, loaded, sampling, model_ref))

    def show_progress(self, message: ModelLoading) -> None:
        self._host.status.info.model = message.model
        self._host.set_state(f"loading {message.fraction:.0%}")

    async def ready(self, message: ModelReady) -> None:
        host = self._host
        await host.chat_log.clear_notices()  # an earlier "model not loaded" no longer applies
        host.withdraw_notices("model")
        self.engine, self.loading, self.error = message.engine, None, ""
        self.loaded_ref = message.model_ref
        self.sampling = message.sampling
        if self.thinking_mode:  # /think outlives a model switch
            from localchat.engine.options import Sampling

            self.sampling = self.sampling or Sampling()
            self.sampling.thinking = self.thinking_mode
        if self.answer_format is not None:  # and so does /format
            from localchat.engine.options import Sampling, shaped

            self.sampling = shaped(self.sampling or Sampling(), self.answer_format)
        host.status.info.show_loaded(message.loaded)
        host.set_state("idle")
        if host.conversation is not None:
            host.conversation.attach(self.engine, self.sampling)

    def failed(self, message: ModelFailed) -> bool:
        """The model did not load. False: the model in use stays (or the one coming back);
        True: the app has no model now, and the caller offers to download it or gives up
        (``show_unloaded``)."""
        host = self._host
        if message.kept:
            host.notify(f"{message.message}. Keeping {host.status.info.model or 'the current model'}.",
                        title="Model not switched", severity="error", timeout=15)
            if self.engine is not None:
                self.loading = None
                host.set_state("idle")
            return False
        self.loading, self.error = None, message.message
        host.status.info.model = message.model
        host.set_state("no model")
        return True

    async def show_unloaded(self, message: ModelFailed) -> None:
        """Say that no model is loaded, and why (a notice in the log and a toast)."""
        await self._host.chat_log.add_notice(f"{message.message}. Pick another with /model NAME.")
        self._host.notify(message.message, title="Model not loaded", severity="error", timeout=15,
                          cause="model")

    def close(self) -> None:
        """At unmount: the loaded model's memory is freed."""
        if self.engine is not None:
            self.engine.close()

    def set_format(self, argument: str) -> str:
        """``/format json | SCHEMA | FILE.gbnf | off``: the shape of the answers from the next
        message on (no argument: says which it is); the line to show the user."""
        from localchat.engine.options import Sampling, shaped
        from localchat.formats import json_format, read_schema, schema_format

        text = argument.strip()
        if not text:
            return (f"Answers: {self.answer_format.name}." if self.answer_format is not None
                    else "Answers: as the model writes them (/format json | SCHEMA | FILE.gbnf).")
        if text.lower() == "off":
            shape = None
        elif text.lower() == "json":
            shape = json_format()
        elif text.endswith(".gbnf"):
            from localchat.engine.sampling.grammar import check_grammar
            from localchat.formats import read_grammar

            shape = read_grammar(text)
            check_grammar(shape.grammar)
        else:
            shape = schema_format(read_schema(text))
        self.answer_format = shape
        self.sampling = shaped(self.sampling or Sampling(), shape)
        chat = self._host.conversation.chat if self._host.conversation is not None else None
        if chat is not None:
            chat.sampling = shaped(chat.sampling, shape)
        self._host.status.info.answer_format = shape.name if shape is not None else ""
        self._host.status.refresh()
        if shape is None:
            return "Answers as the model writes them from the next message."
        return f"Answers in the shape {shape.name} from the next message."

    def set_thinking(self, mode: str) -> str:
        """``/think MODE``: set the thinking switch for the next turns; the line to show the user."""
        from localchat.engine.options import Sampling
        from localchat.settings import THINKING_MODES

        engine = self.engine
        has_switch = engine is not None and engine.supports_thinking
        model = engine.name if engine is not None else "the model"
        if not mode:
            current = self.sampling.thinking if self.sampling is not None else "auto"
            switch = "has a thinking switch" if has_switch else "has no thinking switch"
            return f"Thinking: {current} ({model} {switch})."
        if mode not in THINKING_MODES:
            raise UserError("Usage: /think on|off|auto")
        if self.sampling is None:
            self.sampling = Sampling()
        self.sampling.thinking = self.thinking_mode = mode
        chat = self._host.conversation.chat if self._host.conversation is not None else None
        if chat is not None:
            chat.sampling.thinking = mode
        if mode != "auto" and not has_switch:
            return f"{model} has no thinking switch: /think {mode} applies to models that have one."
        return f"Thinking {mode} from the next message."

