"""Launching the app (``localchat`` with no sub-command): open the session store, run the app
until it quits, and end the process even if a worker thread is stuck (``shutdown``)."""

from __future__ import annotations

from functools import partial

from localchat import logs
from localchat.store import Store
from localchat.tui.app import LocalChatApp
from localchat.tui.engine_factories import build_engine
from localchat.tui.graphics_support import prepare_previews
from localchat.tui.shutdown import exit_now, run_until_quit


def run_app(model: str | None = None, continue_last: bool = False, session: str | None = None,
            speculative: str | None = None) -> int:
    """Open the app (``localchat`` with no sub-command). Returns the exit status.
    ``speculative``: the ``--speculative`` mode for every model it loads (None: the config's).

    Raises ``UserError`` (shown by the CLI as one line) when the session database cannot be used.
    """
    with open_store() as store:
        if session:
            store.resolve_session(session, create=True)  # an unknown id: one line, before the window opens
        logs.attach()  # the app's own failures (a turn, a model load) keep their tracebacks too
        prepare_previews()  # asks the terminal about pictures now: Textual will read its input
        app = LocalChatApp(store=store, model=model, continue_last=continue_last, session=session,
                           engine_factory=partial(build_engine, speculative=speculative))
        code, stuck = run_until_quit(app, app.end_on_signal)
    if stuck:  # a worker that never returns must not keep the process alive after a quit
        exit_now(code)
    return code


def open_store() -> Store:
    """The session store; on a full disk or in a read-only home, opened read-only, so that the
    history can still be read (the app says so; a turn then fails to save with its notice)."""
    from localchat.paths import database_file
    from localchat.store.connect import StoreError, unwritable

    try:
        return Store.open()
    except StoreError:
        path = database_file()
        if not (path.is_file() and unwritable(path)):
            raise
        store = Store.open(read_only=True)  # an older schema needs writes: raises again
        if store.last_session() is None:  # nothing to read, and no session can be started
            store.close()
            raise
        return store
