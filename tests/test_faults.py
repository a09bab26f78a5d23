"""The fault suite (issue 15): bad input and faults a new user hits, one test per numbered item.

Each fault is reproduced with real parts: the CLI in a subprocess (an abort or a traceback is
visible there exactly as a user sees it), real SQLite files, the real engine and test model,
loopback servers for the remote, and tmpfs mounts for full disks (skipped when mounting is not
allowed). The promise under test: a clear one-line error and a non-zero exit, or a notice and a
working answer; never an abort, a hang, a traceback, or a lost or garbled turn.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from fault_server import FaultServer, KeepAlives, Stream, chunk
from store_lock import store_locked

from localchat.errors import UserError

REPO = Path(__file__).resolve().parents[1]


# -- helpers ----------------------------------------------------------------------------------


def localchat(*args: str, home: Path, stdin: bytes | None = None, timeout: float = 180,
              env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the CLI as a user would; returns (exit status, stdout, stderr)."""
    environment = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO),
                   **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "localchat", *args], input=stdin,
                          capture_output=True, timeout=timeout, env=environment)
    return (proc.returncode, proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"))


def the_error(err: str) -> str:
    """The one error line on stderr; fails on a traceback or on several errors."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("localchat: error:")]
    assert len(lines) == 1, err
    return lines[0]


def ask_here(capsys, model: Path, *args: str) -> tuple[int, str, str]:
    """``localchat ask`` in this process (no interpreter start-up; the home is the test's)."""
    from localchat.cli import main

    code = main(["ask", "-m", str(model), "--temperature", "0", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write_config(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def tmpfs(directory: Path, size: str, *options: str):
    """A small tmpfs at ``directory`` (a disk that fills up, or a read-only one); skips the test
    when this machine does not allow mounting."""
    directory.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(directory)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system holding ``directory``; returns the filler file (delete to free)."""
    filler = directory / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    # the last partial blocks, too
    with contextlib.suppress(OSError), open(directory / "filler-2", "wb") as f:
        while True:
            f.write(b"\0" * 512)
            f.flush()
    return filler


def free(directory: Path) -> None:
    for name in ("filler", "filler-2"):
        (directory / name).unlink(missing_ok=True)


# -- crashes and hangs ------------------------------------------------------------------------


def test_01_tiny_n_ctx_is_a_clear_error_and_prefill_never_exceeds_the_batch(test_model_path, capsys):
    from localchat.engine.runtime import MIN_N_CTX

    code, _, err = ask_here(capsys, test_model_path, "--n-ctx", "16", "hi")
    assert code == 1 and f"at least {MIN_N_CTX}" in the_error(err)

    # Below the CLI, a small n_ctx gets llama.cpp's floor, and with it a batch of n_ctx tokens:
    # a prompt longer than that batch used to abort the process in llama_decode (GGML_ASSERT).
    script = (
        "import sys\n"
        "from localchat.engine.engine import Engine\n"
        "from localchat.engine.options import EngineOptions, Sampling\n"
        "engine = Engine(sys.argv[1], EngineOptions(n_ctx=100, gpu_layers=0))\n"
        "engine.load()\n"
        "words = ' '.join(str(i) for i in range(40))\n"
        "final = list(engine.submit([{'role': 'user', 'content': 'Count: ' + words}],\n"
        "                           Sampling(temperature=0, max_tokens=1)))[-1]\n"
        "print(type(final).__name__)\n"
        "engine.close()\n")
    proc = subprocess.run([sys.executable, "-c", script, str(test_model_path)], capture_output=True,
                          text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout.split() == ["Done"]


def test_02_a_bad_remote_url_is_a_config_error_with_its_line_and_the_breaker_never_fails_on_it(isolated_home):
    from localchat.errors import ConfigError
    from localchat.remote.breaker import CircuitBreaker
    from localchat.settings import load_config

    path = write_config(isolated_home, '[remote]\nmode = "auto"\n'
                        'base_url = "http://127.0.0.1:99999/v1"\n')
    with pytest.raises(ConfigError) as error:
        load_config()
    assert str(error.value).startswith(f"{path}:3: remote.base_url")
    assert "port" in str(error.value)
    # Whatever reaches the breaker (it is built before any request), it must not be what fails.
    assert "closed" in repr(CircuitBreaker(base_url="http://127.0.0.1:99999/v1"))


def test_03_a_remote_sending_only_keep_alives_times_out_once_without_a_retry():
    from localchat.events import Failed
    from localchat.remote.client import RemoteClient
    from localchat.settings.remote import RemoteSettings

    with FaultServer([Stream([KeepAlives(0.02)])]) as server:
        client = RemoteClient(RemoteSettings(mode="auto", base_url=server.base_url, timeout_s=0.3))
        events = list(client.stream([{"role": "user", "content": "hi"}]))
        client.close()
    assert isinstance(events[-1], Failed) and "keep-alive" in events[-1].message
    assert len(server.requests) == 1  # a retry would double the wait before the local answer


def test_04_non_utf8_stdin_is_decoded_with_replacement_and_a_notice(test_model_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 au lait?")))
    code, out, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "--json", "-")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "Traceback" not in err
    assert any(e["event"] == "notice" and "UTF-8" in e["message"] for e in events)
    assert events[-1]["event"] == "done"


# -- item 5: tracebacks -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_05a_a_store_path_that_is_a_folder_or_fifo_is_one_line(kind, tmp_path):
    data = tmp_path / "data"
    data.mkdir(parents=True)
    if kind == "folder":
        (data / "sessions.db").mkdir()
    else:
        os.mkfifo(data / "sessions.db")
    code, _, err = localchat("sessions", home=tmp_path, timeout=60)
    assert code == 1 and "sessions.db" in the_error(err)


def test_05b_a_read_only_home_is_one_line_for_models_and_a_finding_for_doctor(tmp_path):
    home = tmp_path / "home"
    with tmpfs(home, "1m", "ro"):
        code, _, err = localchat("models", home=home, timeout=60)
        assert code == 1 and "LOCALCHAT_HOME" in the_error(err)
        code, out, err = localchat("doctor", home=home, timeout=60)
        assert code == 0 and "Traceback" not in err
        assert "PROBLEM" in out and "cannot create the folder" in out


@pytest.fixture(scope="module")
def broken_template_model(test_model_path, tmp_path_factory) -> Path:
    """The test model with its embedded chat template made unparseable (same length)."""
    data = bytearray(test_model_path.read_bytes())
    start = data.find(b"{% for message in messages %}")
    assert start > 0
    data[start:start + 2] = b"{{"  # "{{ for message ... %}" does not compile
    path = tmp_path_factory.mktemp("gguf") / "broken-template.gguf"
    path.write_bytes(bytes(data))
    return path


def test_05c_a_gguf_template_that_does_not_compile_is_one_line(broken_template_model, capsys):
    code, _, err = ask_here(capsys, broken_template_model, "--max-tokens", "2", "hi")
    assert code == 1 and "template" in the_error(err)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_05d_a_snapshot_path_that_is_a_folder_does_not_stop_a_session(test_model_path, capsys, isolated_home):
    (isolated_home / "cache" / "kv" / "session-1.kvsnap").mkdir(parents=True)
    for _ in range(2):  # a restore, then a save, meet the folder
        code, out, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "-s", "s", "hi")
        assert code == 0 and out.strip() and "Traceback" not in err


def _nested_gguf(depth: int) -> bytes:
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    key = b"deep"
    value = struct.pack("<I", 9)  # an array...
    value += b"".join(struct.pack("<IQ", 9, 1) for _ in range(depth))  # ...of arrays, nested
    value += struct.pack("<IQ", 4, 0)  # ...ending in an empty u32 array
    return header + struct.pack("<Q", len(key)) + key + value


def test_05e_deeply_nested_gguf_metadata_is_one_line(tmp_path):
    path = tmp_path / "deep.gguf"
    path.write_bytes(_nested_gguf(100_000))
    code, _, err = localchat("ask", "-m", str(path), "hi", home=tmp_path, timeout=60)
    assert code == 1 and "nests arrays" in the_error(err)


# -- item 6: a full disk under the KV snapshots --------------------------------------------------


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_06_a_full_disk_while_saving_a_snapshot_is_one_notice_and_keeps_the_old_one(test_model_path, capsys, isolated_home):
    kv = isolated_home / "cache" / "kv"
    with tmpfs(kv, "16m"):
        code, _, err = ask_here(capsys, test_model_path, "--max-tokens", "4", "-s", "s", "hi")
        assert code == 0 and "Traceback" not in err
        [snapshot] = list(kv.glob("*.kvsnap"))
        saved = snapshot.read_bytes()

        fill(kv)
        code, out, err = ask_here(capsys, test_model_path, "--max-tokens", "4", "-s", "s", "more")
        assert code == 0 and out.strip() and "Traceback" not in err
        assert err.count("could not save this session's context (disk full)") == 1
        assert snapshot.read_bytes() == saved  # the previous snapshot is intact

        free(kv)
        code, _, err = ask_here(capsys, test_model_path, "--max-tokens", "4", "-s", "s", "again")
        assert code == 0 and "could not save" not in err
        assert snapshot.read_bytes() != saved  # the next write was tried, and succeeded


# -- lost or garbled data ---------------------------------------------------------------------


def test_07_two_asks_on_one_session_take_turns(test_model_path, tmp_path):
    from localchat.store import Store

    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "localchat", "ask", "-m", str(test_model_path),
                               "--temperature", "0", "--max-tokens", "24", "-s", "same",
                               f"Question {n}: name a colour."],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for n in (1, 2)]
    for proc in procs:
        proc.communicate(timeout=180)
        assert proc.returncode == 0
    with Store.open(tmp_path / "data" / "sessions.db") as store:
        turns = store.turns(store.find_session("same").id)
    # Serialised: each reply follows its own prompt (U1 A1 U2 A2), never U1 U2 A1 A2.
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]


def test_07b_the_app_takes_the_same_lock_and_catches_up_with_turns_another_process_stored():
    from fake_engine import FakeEngine

    from localchat.chat.conversation import Conversation
    from localchat.store import Store
    from localchat.store.locks import SessionLock

    engine = FakeEngine(reply="ok")
    engine.load()
    with Store.open() as store:
        conversation = Conversation(store, store.create_session("same"))
        conversation.attach(engine)
        other = SessionLock(conversation.session_id)  # an `ask -s same` answering right now
        assert other.try_acquire()
        with pytest.raises(UserError, match="another localchat process"), conversation.turn_lock():
            pass
        store.add_exchange(conversation.session_id, "U1 from ask", "A1 from ask", model="m")
        other.release()
        with conversation.turn_lock():
            assert [m.content for m in conversation.chat.history] == ["U1 from ask", "A1 from ask"]
            final = list(conversation.send("U2 from the app"))[-1]
            conversation.record_reply(final, "m")
            assert not other.try_acquire()  # held for the whole turn
    assert [m["content"] for m in engine.submitted[-1]][:3] == [
        "U1 from ask", "A1 from ask", "U2 from the app"]


def test_08a_a_full_disk_at_the_store_commit_says_so_and_keeps_neither_half(tmp_path):
    from localchat.store import Store
    from localchat.store.store import StoreError

    data = tmp_path / "data"
    with tmpfs(data, "2m"), Store.open(data / "sessions.db") as store:
        session = store.create_session("s")
        store.add_exchange(session.id, "warm up", "ok", model="m")
        fill(data)
        with pytest.raises(StoreError) as error:
            store.add_exchange(session.id, "x" * 300_000, "y" * 300_000, model="m")
        assert str(error.value).startswith("Disk full")
        assert "no transaction is active" not in str(error.value)
        free(data)
        assert [t.content for t in store.turns(session.id)] == ["warm up", "ok"]


def test_08b_a_reply_the_app_cannot_store_is_forgotten_by_the_model_too(engine, monkeypatch):
    """Store locked past the busy timeout: the reply is not reused by the next turn."""
    from localchat.chat.conversation import Conversation
    from localchat.chat.services import ChatServices
    from localchat.settings import ContextSection, Settings
    from localchat.store import Store
    from localchat.store import store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 50)
    with Store.open() as store:
        # No snapshots, and no background summary: after a long second reply one would be
        # due, and while it runs (or once it is in) the record shows its messages, not the turn's.
        services = ChatServices(Settings(context=ContextSection(summarize=False)), None,
                                lambda: None)
        conversation = Conversation(store, store.create_session("s"), services)
        conversation.attach(engine)
        handle = conversation.send("Say hi.")
        final = list(handle)[-1]
        with store_locked(store.path), pytest.raises(UserError, match="not saved"):
            conversation.record_reply(final, "m")
        assert [m.role for m in conversation.chat.history] == ["user"]
        assert [t.role for t in store.turns(conversation.session_id)] == ["user"]
        # The next turn does not build on the lost reply: its cells leave the KV cache.
        final = list(conversation.send("And bye."))[-1]
        assert final.timings.approx_n == 0
        assert engine.wait_idle(timeout=60)
        assert [m.role for m in engine.cached_messages()] == ["user", "user", "assistant"]


def test_09_a_remote_failing_mid_reply_is_retracted_before_the_local_answer(test_model_path, capsys, isolated_home):
    from fault_server import Drop, Stream

    with FaultServer([Stream([chunk("Hel"), Drop()])]) as server:
        write_config(isolated_home, f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n')
        # A prompt the router sends to the remote at once (long and "hard").
        args = ("--max-tokens", "6", "--route", "auto",
                "Prove step by step that the square root of 2 is irrational, with a rigorous "
                "proof by contradiction, and explain each step of the proof in detail.")
        code, out, err = ask_here(capsys, test_model_path, "--json", *args)
        events = [json.loads(line) for line in out.splitlines()]
        kinds = [e["event"] for e in events]
        assert code == 0 and "retract" in kinds
        retract = events[kinds.index("retract")]
        assert retract["text"] == "Hel"
        assert any(e["event"] == "token" for e in events[kinds.index("retract"):])  # local reply

        code, out, err = ask_here(capsys, test_model_path, *args)
        assert code == 0
        first, marker, *rest = out.split("\n", 2)
        assert first == "Hel" and marker.startswith("[remote reply failed")
        assert rest and rest[0].strip()  # the local reply follows on its own line


def test_10_head_tail_with_a_small_max_tokens_fits_or_refuses_and_stores_nothing_cut(test_model_path, capsys, isolated_home):
    from localchat.store import Store

    write_config(isolated_home, '[context]\noverlong = "head_tail"\n')
    long_prompt = "word " * 400 + "What was the first word?"
    code, out, err = ask_here(capsys, test_model_path, "--n-ctx", "256", "--max-tokens", "4",
                              "-s", "s", "--json", long_prompt)
    assert "Traceback" not in err
    with Store.open() as store:
        turns = store.turns(store.find_session("s").id)
    # The budget counts what the template adds on its own (SmolLM2's default system prompt), so
    # the cut leaves room for the reply instead of overflowing by those tokens.
    assert code == 0, err
    assert [t.role for t in turns] == ["user", "assistant"]
    assert "tokens cut" in turns[0].content



# -- wrong or confusing -------------------------------------------------------------------------


@pytest.mark.parametrize("flags, says", [
    (("--max-tokens", "0"), "--max-tokens must be at least 1"),
    (("--max-tokens", "-1"), "--max-tokens must be at least 1"),
    (("--temperature", "-1"), "--temperature must be"),
    (("--temperature", "nan"), "--temperature must be"),
    (("--temperature", "inf"), "--temperature must be"),
    (("--n-ctx", "40"), "--n-ctx 40 is too small"),
    (("--n-ctx", "255"), "--n-ctx 255 is too small"),
    (("--n-ctx", str(10**9)), "trained for"),
    (("-s", ""), "session name cannot be empty"),
    (("-s", "two\nlines"), "control characters"),
])
def test_11_flags_that_would_be_changed_or_ignored_are_refused(flags, says, test_model_path, capsys):
    code, out, err = ask_here(capsys, test_model_path, *flags, "hi")
    assert code == 1 and not out and says in the_error(err)


def test_12_sessions_lists_names_with_control_sequences_neutralised(tmp_path):
    from localchat.store import Store

    with Store.open(tmp_path / "data" / "sessions.db") as store:
        store._db.execute("INSERT INTO sessions (name, system, model, created_at, updated_at) "
                          "VALUES (?, '', '', 0, 0)", ("evil\x1b]0;PWNED\x07\x1b[2J",))
    code, out, err = localchat("sessions", home=tmp_path, timeout=60)
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "evil^[]0;PWNED^G^[[2J" in out


@pytest.mark.parametrize("text, line, says", [
    ('[engin]\nn_ctx = 2048\n', 1, "unknown section [engin] (did you mean [engine]?)"),
    ('[engine]\nkv_type = "f16"\nn_ctxx = 2048\n', 3, "unknown key 'n_ctxx' in [engine] (did you mean 'n_ctx'?)"),
    ('default_modle = "x"\n', 1, "unknown setting 'default_modle' (did you mean 'default_model'?)"),
    ('[remote]\nbase_url = "http://h/v1"\nmode = "sometimes"\n', 3, "remote.mode must be"),
])
def test_13_misspelled_names_and_bad_modes_name_file_line_and_the_nearest_name(text, line, says, isolated_home):
    from localchat.errors import ConfigError
    from localchat.settings import load_config

    path = write_config(isolated_home, text)
    with pytest.raises(ConfigError) as error:
        load_config()
    assert str(error.value).startswith(f"{path}:{line}: ")
    assert says in str(error.value)


def _gguf_with_architecture(model: Path, target: Path, arch: bytes) -> Path:
    """The test model with general.architecture renamed (same length, so offsets hold)."""
    data = bytearray(model.read_bytes())
    key = b"general.architecture"
    at = data.find(key) + len(key) + 4  # value type (u32)
    length = struct.unpack_from("<Q", data, at)[0]
    assert length == len(arch)
    data[at + 8:at + 8 + length] = arch
    target.write_bytes(bytes(data))
    return target


def test_14_an_unsupported_architecture_is_named_and_a_folder_is_not_a_missing_file(test_model_path, tmp_path, capsys):
    odd = _gguf_with_architecture(test_model_path, tmp_path / "odd.gguf", b"zzzzz")
    code, _, err = ask_here(capsys, odd, "hi")
    assert code == 1 and "'zzzzz' is not supported by this llama.cpp build" in the_error(err)

    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    code, _, err = ask_here(capsys, folder, "hi")
    assert code == 1 and "is a directory" in the_error(err)


async def test_15_escape_then_enter_in_one_burst_types_no_caret_and_a_typed_caret_stays():
    from textual.app import App

    from localchat.tui.prompt import PromptInput

    sent: list[str] = []

    class Host(App):
        def compose(self):
            yield PromptInput([], lambda text: [])

        def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
            sent.append(message.text)

    app = Host()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("h", "i")
        # Esc, Enter, then an arrow key within the escape delay, through Textual's own parser:
        # it yields "^", Enter, then the arrow.
        for event in _parse_keys("\x1b\r\x1b[D"):
            prompt.post_message(event)
        await pilot.pause()
        assert sent == ["hi"]  # sent as typed, without a stray ^

        await pilot.press("2", "circumflex_accent")
        await _wait_for(pilot, lambda: prompt.text.endswith("2^"))


async def _wait_for(pilot, condition, tries: int = 200) -> None:
    for _ in range(tries):
        if condition():
            return
        await pilot.pause(0.01)
    assert condition()


def _parse_keys(data: str) -> list:
    from textual import events
    from textual._xterm_parser import XTermParser

    parser = XTermParser(False)
    parsed = list(parser.feed(data)) + list(parser.feed(""))
    return [e for e in parsed if isinstance(e, events.Key)]


def _stalled_pull(monkeypatch, ref: str, content: bytes) -> int:
    """``localchat pull ref`` in this process from a hub that stops sending after 100 KB of
    ``content``, with short timeouts and no waits between huggingface_hub's resume attempts."""
    from hub_server import FakeHub
    from huggingface_hub import constants, file_download

    from localchat.cli import main

    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
        monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.2)
        # huggingface_hub waits 1 s before each of its 5 resume attempts; the test needs no wait.
        monkeypatch.setattr(file_download, "time", _NoSleep())
        parts = ref.removeprefix("hf:").split("/")
        hub.add_file("/".join(parts[:2]), "/".join(parts[2:]), content)
        hub.stall_after(100_000)
        return main(["pull", ref])


def test_49_the_hubs_own_warnings_go_to_the_log_not_the_screen(monkeypatch, capsys):
    # huggingface_hub gives its logger a handler on the stderr of the moment it is imported: its
    # retry warnings printed beside the progress bar (over the app's screen in a download), and
    # when that stderr was an earlier test's capture, closed since, each warning became a
    # "--- Logging error ---" with a traceback (a failure found by a shuffled run).
    import io
    import logging

    from hub_server import make_gguf

    closed = io.StringIO()
    closed.close()
    stale = logging.StreamHandler(closed)
    logging.getLogger("huggingface_hub").addHandler(stale)
    try:
        code = _stalled_pull(monkeypatch, "hf:acme/Tiny-GGUF/tiny.gguf", make_gguf())
    finally:
        logging.getLogger("huggingface_hub").removeHandler(stale)
    err = capsys.readouterr().err
    assert code == 1 and "Logging error" not in err and "Trying to resume" not in err, err


def test_16_a_stalled_pull_says_the_hub_stopped_sending(monkeypatch, capsys):
    from hub_server import make_gguf

    code = _stalled_pull(monkeypatch, "hf:acme/Tiny-GGUF/tiny.gguf", make_gguf())
    err = capsys.readouterr().err
    assert code == 1 and "the Hub stopped sending" in the_error(err.replace("\r", "\n"))


class _NoSleep:
    def __getattr__(self, name: str):
        import time

        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


# -- issue 21: names, paths and the terminal --------------------------------------------------


def _hub_env(hub) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}


def on_a_terminal(*args: str, home: Path, timeout: float = 60,
                  env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; returns (exit status, what the
    terminal received)."""
    import pty
    import select

    primary, secondary = pty.openpty()
    environment = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "localchat", *args], stdin=subprocess.DEVNULL,
                            stdout=secondary, stderr=secondary, env=environment)
    os.close(secondary)
    received = b""
    while True:
        ready, _, _ = select.select([primary], [], [], timeout)
        assert ready, f"no output within {timeout} s"
        try:
            data = os.read(primary, 65536)
        except OSError:  # EIO: the process closed its side
            break
        if not data:
            break
        received += data
    os.close(primary)
    return proc.wait(timeout=timeout), received.decode("utf-8", "replace")


@pytest.mark.parametrize("ref", [
    "hf:org/repo/../../../../../evil/x/resolve/main/evil.gguf",
    "hf:evil/../x/evil.gguf",
    "hf:acme/Tiny-GGUF/..\\..\\evil.gguf",
    "hf:acme/Tiny-GGUF/\x1b[2Jevil.gguf",
    "hf:acme/Tiny-GGUF/evil\u202egguf.gguf",
])
def test_21_1_a_hub_name_that_would_leave_the_models_folder_is_refused_before_any_request(ref, tmp_path):
    from hub_server import FakeHub, make_gguf

    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.add_file("evil/x", "evil.gguf", make_gguf())
        code, out, err = localchat("pull", ref, home=home, timeout=60, env=_hub_env(hub))
        assert code == 1
        assert "is not a usable" in the_error(err) or "cannot hold control characters" in the_error(err)
        assert hub.requests == []
    assert not [p for p in tmp_path.rglob("*") if "evil" in p.name]


def test_21_1_a_folder_the_hub_nests_still_pulls_and_import_names_stay_single(tmp_path):
    from hub_server import FakeHub, make_gguf

    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.add_file("acme/Tiny-GGUF", "sub/dir/tiny.gguf", make_gguf())
        code, out, err = localchat("pull", "hf:acme/Tiny-GGUF/sub/dir/tiny.gguf", home=home,
                                   timeout=60, env=_hub_env(hub))
    assert code == 0, err
    assert (home / "data" / "models" / "acme--Tiny-GGUF" / "sub" / "dir" / "tiny.gguf").is_file()

    model = tmp_path / "tiny.gguf"
    model.write_bytes(make_gguf())
    for name in ("../../../outside", "..", "a/b", "/tmp/x"):
        code, out, err = localchat("import", str(model), "--name", name, home=home, timeout=60)
        assert code == 1 and "not a usable model name" in the_error(err), (name, err)
    assert not (tmp_path / "outside.gguf").exists() and not (home / "data" / "outside.gguf").exists()
    assert not (home / "data" / "models" / "imported").exists()


def test_21_1_a_registry_entry_whose_file_would_leave_the_models_folder_names_its_line(tmp_path):
    home = tmp_path / "home"
    write_config(home, "")
    (home / "models.toml").write_text('[models.bad]\nrepo = "acme/r"\nfilename = "../../x.gguf"\n')
    code, out, err = localchat("models", home=home, timeout=60)
    assert code == 1 and "models.toml:3: models.bad.filename: '..' is not a usable" in the_error(err)


def test_21_2_terminal_output_is_neutralised_in_one_place_and_pipes_stay_byte_exact(tmp_path):
    from localchat.store import Store

    home = tmp_path / "home"
    hostile = "see \x1b]52;c;cm0gLXJmIH4=\x07 and \x1b[2J, \x9b31m, gnp\u202e.exe, zero\u200bwidth"
    with Store.open(home / "data" / "sessions.db") as store:
        session = store.create_session("plain")
        store.add_exchange(session.id, "hi", hostile, model="m")

    code, piped, err = localchat("sessions", "--export", "plain", home=home, timeout=60)
    assert code == 0 and hostile in piped  # a file or a pipe gets the stored text exactly

    code, shown = on_a_terminal("sessions", "--export", "plain", home=home)
    assert code == 0
    assert not any(ch in shown for ch in "\x1b\x07\x9b\u202e\u200b"), repr(shown)
    assert "^[]52;c;cm0gLXJmIH4=^G" in shown and "^[[2J" in shown and "\\x9b31m" in shown
    assert "gnp<U+202E>.exe" in shown and "zero<U+200B>width" in shown

    code, shown = on_a_terminal("rm", "nope\x1b[2J", home=home)  # an error on stderr too
    assert code == 1 and "\x1b" not in shown and "unknown model 'nope^[[2J'" in shown


@pytest.mark.parametrize("args", [
    ("ask", "-s", "gnp\u202e.exe", "hi"),
    ("--session", "zero\u200bwidth"),
    ("import", "{model}", "--name", "tiny\u202e"),
    ("import", "{model}", "--name", "tiny\x1b[2J"),
])
def test_21_2_names_with_control_bidi_or_zero_width_characters_are_refused_where_they_enter(args, tmp_path):
    from hub_server import make_gguf

    model = tmp_path / "tiny.gguf"
    model.write_bytes(make_gguf())
    home = tmp_path / "home"
    code, out, err = localchat(*(a.format(model=model) for a in args), home=home, timeout=60)
    assert code == 1 and "cannot hold control characters" in the_error(err)
    assert not (home / "models.toml").exists()
    assert not (home / "data" / "sessions.db").exists() or not sqlite3.connect(
        home / "data" / "sessions.db").execute("SELECT count(*) FROM sessions").fetchone()[0]


def test_21_3_import_refuses_a_fifo_at_once_and_follows_a_relative_symlink(tmp_path):
    from hub_server import make_gguf

    home = tmp_path / "home"
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    code, out, err = localchat("import", str(fifo), home=home, timeout=30)  # a hang times out
    assert code == 1 and "is not a regular file" in the_error(err)

    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "tiny.gguf").write_bytes(make_gguf())
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "tiny.gguf").symlink_to(Path("..") / "files" / "tiny.gguf")
    code, out, err = localchat("import", str(tmp_path / "links" / "tiny.gguf"), home=home,
                               timeout=60)
    assert code == 0, err
    stored = home / "data" / "models" / "imported" / "tiny.gguf"
    assert stored.is_file() and not stored.is_symlink()
    assert stored.read_bytes() == make_gguf()
    code, out, err = localchat("models", "--json", home=home, timeout=60)
    assert {row["name"]: row for row in json.loads(out)}["tiny"]["downloaded"]


@pytest.mark.parametrize("args", [
    ("sessions", "--search", "\udcff"),
    ("sessions", "--export", "caf\udce9"),
    ("-s", "caf\udce9", "sessions"),
    ("import", "{model}", "--name", "caf\udce9"),
])
def test_21_8_arguments_that_are_not_utf8_are_one_line_and_a_failed_import_leaves_nothing(args, tmp_path):
    from hub_server import make_gguf

    model = tmp_path / "tiny.gguf"
    model.write_bytes(make_gguf())
    home = tmp_path / "home"
    code, out, err = localchat(*(a.format(model=model) for a in args), home=home, timeout=60)
    assert code == 1 and "is not valid UTF-8 text" in the_error(err)
    imported = home / "data" / "models" / "imported"
    assert not imported.exists() or not list(imported.iterdir())
    assert not (home / "models.toml").exists()


# -- issue 21: the CLI edge, config and the store on bad disks --------------------------------


def _run_to(stdout, *args: str, home: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI with ``stdout`` as its standard output; returns (exit status, stderr)."""
    environment = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "localchat", *args], stdout=stdout,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120, env=environment)
    return proc.returncode, proc.stderr.decode("utf-8", "replace")


@contextlib.contextmanager
def closed_pipe():
    """The write end of a pipe whose reader has already left (`| head -c0`): every write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        yield write_end
    finally:
        os.close(write_end)


def test_21_07_a_closed_stdout_exits_quietly_and_a_full_one_is_one_line(test_model_path, tmp_path):
    from localchat.cli import EXIT_CLOSED_PIPE

    home = tmp_path / "home"
    for args in (("models",), ("models", "--json"),
                 ("ask", "-m", str(test_model_path), "--max-tokens", "4", "hi")):
        with closed_pipe() as stdout:
            code, err = _run_to(stdout, *args, home=home)
        assert (code, err) == (EXIT_CLOSED_PIPE, ""), err  # no traceback, no "Exception ignored"
        with open("/dev/full", "wb") as stdout:
            code, err = _run_to(stdout, *args, home=home)
        assert code == 1 and "the output could not be written" in the_error(err)
        assert "Exception ignored" not in err


def test_21_09_deeply_nested_config_and_registry_are_one_line_naming_the_file(tmp_path):
    home = tmp_path / "home"
    deep = "a = " + "[" * 10_000 + "]" * 10_000 + "\n"
    for name, text in (("config.toml", deep), ("models.toml", "x = " + "{a = " * 5_000 + "1" + "}" * 5_000)):
        home.mkdir(exist_ok=True)
        for other in ("config.toml", "models.toml"):
            (home / other).unlink(missing_ok=True)
        (home / name).write_text(text)
        code, _, err = localchat("models", home=home)
        assert code == 1 and str(home / name) in the_error(err) and "nested too deeply" in err


def test_21_09b_the_app_ending_on_an_error_at_start_exits_non_zero(monkeypatch):
    # What the nested config did before it was a ConfigError: an unexpected error while the
    # app starts. Textual shows it and ends the app; the exit status must say so too.
    from textual.app import App

    from localchat.tui import launch as tui
    from localchat.tui.sessions import Sessions

    def broken_start(self):
        raise RuntimeError("broken at start")

    monkeypatch.setattr(Sessions, "_initial", broken_start)
    monkeypatch.setattr(tui.LocalChatApp, "run",
                        lambda self, **options: App.run(self, headless=True, **options))
    assert tui.run_app() != 0


@pytest.mark.parametrize("section, key, value, says", [
    ("sampling", "max_tokens", "0", "sampling.max_tokens must be at least 1, not 0"),
    ("sampling", "max_tokens", "-5", "sampling.max_tokens must be at least 1, not -5"),
    ("sampling", "temperature", "nan", "sampling.temperature must be at least 0 (0 is greedy), not nan"),
    ("sampling", "temperature", "-1", "sampling.temperature must be at least 0 (0 is greedy), not -1.0"),
    ("sampling", "top_p", "7", "sampling.top_p must be in [0, 1], not 7.0"),
    ("engine", "n_threads", "-4", "engine.n_threads must be at least 0 (0 lets llama.cpp pick), not -4"),
    ("engine", "n_batch", "0", "engine.n_batch must be at least 1, not 0"),
])
def test_21_10_config_values_out_of_the_flags_range_name_file_line_key_and_range(
        section, key, value, says, test_model_path, capsys, isolated_home):
    path = write_config(isolated_home, f"[{section}]\n{key} = {value}\n")
    code, out, err = ask_here(capsys, test_model_path, "hi")
    assert code == 1 and not out and the_error(err) == f"localchat: error: {path}:2: {says}"


def test_21_10b_flags_check_against_the_same_limits_as_the_file(test_model_path, capsys):
    from localchat.settings import check_setting

    code, _, err = ask_here(capsys, test_model_path, "--temperature", "-1", "hi")
    assert code == 1 and f"--temperature {check_setting('sampling.temperature', -1.0)}" in the_error(err)


@pytest.mark.parametrize("endpoint", ["http://[::1", "http://127.0.0.1:99999", "ftp://127.0.0.1/",
                                      "file:///tmp/hub"])
def test_21_11_a_bad_hf_endpoint_is_one_line_saying_it_is_invalid(endpoint, tmp_path):
    code, _, err = localchat("pull", "hf:acme/Tiny-GGUF/tiny.gguf", home=tmp_path / "home",
                             env={"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"})
    line = the_error(err)
    assert code == 1 and "HF_ENDPOINT is invalid" in line and "resume" not in line


def _history(data: Path) -> None:
    from localchat.store import Store

    with Store.open(data / "sessions.db") as store:
        session = store.create_session("kept")
        store.add_exchange(session.id, "what is a llama", "a camelid", model="m")


def _reads_history(home: Path) -> None:
    code, out, err = localchat("sessions", home=home)
    assert code == 0 and "kept" in out, err
    code, out, err = localchat("sessions", "--export", "kept", home=home)
    assert code == 0 and "a camelid" in out, err
    code, out, err = localchat("sessions", "--search", "llama", home=home)
    assert code == 0 and "llama" in out, err
    code, out, err = localchat("stats", home=home)
    assert code == 0 and "Traceback" not in err, err


def test_21_14_a_full_disk_says_so_and_history_stays_readable(tmp_path):
    from localchat.store import Store

    home = tmp_path / "home"
    data = home / "data"
    with tmpfs(data, "2m"):
        _history(data)
        fill(data)
        _reads_history(home)
        with pytest.raises(UserError, match=f"Disk full: the folder {data} has no space left"), \
                Store.open(data / "sessions.db") as store:
            store.create_session("more")


def test_21_14b_history_stays_readable_in_a_read_only_home(tmp_path):
    home = tmp_path / "home"
    with tmpfs(home, "4m"):
        (home / "data").mkdir()
        _history(home / "data")
        subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
        _reads_history(home)


async def test_21_14c_the_app_shows_history_on_a_full_disk_and_says_nothing_new_is_saved(isolated_home):
    from fake_engine import SIZE, FakeEngine, make_app, notices, ready, reply_finished, send

    from localchat.tui.chat_log import UserMessage
    from localchat.tui.launch import open_store

    data = isolated_home / "data"
    with tmpfs(data, "2m"):
        _history(data)
        fill(data)
        with open_store() as store:
            app = make_app(store, FakeEngine(reply="not kept"))
            async with app.run_test(size=SIZE) as pilot:
                await ready(pilot)
                assert [str(m.body.content) for m in app.chat_log.query(UserMessage)] == ["what is a llama"]
                assert any("nothing new can be saved" in n for n in notices(app))
                await send(pilot, "and a camel?")
                await reply_finished(pilot)
                assert any("Disk full" in n for n in notices(app))


def test_21_leftover_processes_opening_a_fresh_store_at_once_never_read_locked(tmp_path):
    # Switching a fresh database to WAL needs an exclusive lock that SQLite does not wait for
    # with the busy timeout while another opener holds a write lock: "database is locked".
    import threading

    from localchat.store import Store

    errors: list[str] = []

    def open_store(path: Path, start: threading.Barrier) -> None:
        start.wait()
        try:
            Store.open(path).close()
        except UserError as exc:
            errors.append(str(exc))

    for trial in range(60):
        start = threading.Barrier(6)
        threads = [threading.Thread(target=open_store, args=(tmp_path / f"{trial}.db", start))
                   for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


def test_21_15_refused_asks_leave_no_empty_session(test_model_path, capsys, isolated_home):
    from localchat.store import Store

    code, _, err = ask_here(capsys, test_model_path, "--n-ctx", "256", "-s", "refused",
                            "word " * 2000)
    assert code == 1, err
    with closed_pipe() as stdout:
        code, err = _run_to(stdout, "ask", "-m", str(test_model_path), "-s", "unread", "hi",
                            home=isolated_home)
    assert code != 0 and "Traceback" not in err, err
    with Store.open() as store:
        assert store.list_sessions() == []
    code, _, _ = ask_here(capsys, test_model_path, "--max-tokens", "2", "-s", "kept", "hi")
    with Store.open() as store:
        assert code == 0 and [s.name for s in store.list_sessions()] == ["kept"]


# -- issue 21: remotes and the Turn contract ---------------------------------------------------


def remote_config(home: Path, base_url: str, *lines: str) -> None:
    write_config(home, f'[remote]\nmode = "auto"\nbase_url = "{base_url}"\n' + "".join(
        line + "\n" for line in lines))


def breaker_failures(home: Path) -> int:
    return json.loads((home / "cache" / "remote_breaker.json").read_text())["consecutive_failures"]


def test_21_04a_a_remote_trickling_a_line_that_never_ends_fails_after_timeout_s(test_model_path, capsys, isolated_home):
    import time

    from fault_server import Trickle

    with FaultServer([Stream([chunk("Hel"), Trickle(interval_s=0.05)])]) as server:
        remote_config(isolated_home, server.base_url, "timeout_s = 1")
        started = time.monotonic()
        code, out, err = ask_here(capsys, test_model_path, "--route", "remote", "hi")
        elapsed = time.monotonic() - started
        host = server.base_url.split("//")[1].split("/")[0]
    # Bytes kept coming (each read within timeout_s), but no event was complete for timeout_s.
    assert code == 1 and elapsed < 30
    assert the_error(err) == (f"localchat: error: the remote at {host} sent no complete event "
                              "for 1 s (timeout_s): only keep-alives or a line that never ends")
    assert len(server.requests) == 1  # not retried: a retry would double the wait
    assert breaker_failures(isolated_home) == 1


def test_21_04b_a_remote_sending_one_huge_line_fails_at_the_cap_and_the_local_reply_answers(test_model_path, capsys, isolated_home):
    from fault_server import HugeLine

    with FaultServer([Stream([HugeLine(300 * 1024 * 1024)])]) as server:
        remote_config(isolated_home, server.base_url)
        # A prompt the router sends to the remote at once (long and "hard").
        code, out, err = ask_here(
            capsys, test_model_path, "--max-tokens", "4", "--json", "--route", "auto",
            "Prove step by step that the square root of 2 is irrational, with a rigorous "
            "proof by contradiction, and explain each step of the proof in detail.")
        host = server.base_url.split("//")[1].split("/")[0]
    events = [json.loads(line) for line in out.splitlines()]
    fallback = [e for e in events if e["event"] == "notice" and e["kind"] == "fallback"]
    assert code == 0 and "Traceback" not in err
    assert len(fallback) == 1 and fallback[0]["message"] == (
        f"the remote at {host} sent a line over 4 MB without an end; no chat stream needs that; "
        "answering locally")
    assert events[-1]["event"] == "done" and events[-1]["route"] == "local"
    # The client stopped reading at the cap (4 MB): what the server got out is that plus what
    # the sockets buffer, not 300 MB.
    assert server.bytes_sent < 36 * 1024 * 1024
    assert len(server.requests) == 1 and breaker_failures(isolated_home) == 1


@pytest.mark.parametrize("retry_after", ["1", "http-date"])
def test_21_06a_a_429_is_retried_once_after_the_wait_its_retry_after_asks_for(retry_after):
    from email.utils import formatdate

    from fault_server import Status, reply

    from localchat.events import Done, Notice
    from localchat.remote.client import RemoteClient
    from localchat.settings.remote import RemoteSettings

    def headers() -> dict[str, str]:
        # An HTTP date has whole seconds: two seconds after the request is at least one second
        # of waiting (made as the 429 is sent: on a busy machine the request may come late).
        if retry_after == "http-date":
            return {"Retry-After": formatdate(__import__("time").time() + 2, usegmt=True)}
        return {"Retry-After": "1"}

    with FaultServer([Status(429, "slow down", headers), reply("ok")]) as server:
        client = RemoteClient(RemoteSettings(mode="auto", base_url=server.base_url, timeout_s=5))
        events = list(client.stream([{"role": "user", "content": "hi"}]))
        client.close()
    assert isinstance(events[-1], Done) and events[-1].reply == "ok"
    notice = events[0]
    assert isinstance(notice, Notice) and notice.kind == "retry"
    assert "429: slow down; retrying once in" in notice.message and "(Retry-After)" in notice.message
    assert len(server.requests) == 2
    assert server.request_times[1] - server.request_times[0] >= 0.95


def test_21_06b_a_retry_after_beyond_the_turns_budget_is_not_retried_and_says_when_to_try_again(test_model_path, capsys, isolated_home):
    import re

    from fault_server import Status

    with FaultServer([Status(429, "slow down", {"Retry-After": "120"})]) as server:
        remote_config(isolated_home, server.base_url, "timeout_s = 5")
        code, _, err = ask_here(capsys, test_model_path, "--route", "remote", "hi")
    assert code == 1 and len(server.requests) == 1
    assert re.fullmatch(r"localchat: error: remote answered 429: slow down; the remote asks to "
                        r"wait 120 s; try again after (\d{4}-\d\d-\d\d )?\d\d:\d\d", the_error(err))


def test_21_turn_after_stop_the_reader_gets_only_the_final_event_from_the_real_engine(engine):
    from localchat.engine.options import Sampling
    from localchat.events import Done, Token

    messages = [{"role": "user", "content": "Write a long story about a dragon."}]
    # Stopped while running: the engine is ahead of the reader (the flaky case of issue 21).
    handle = engine.submit(messages, Sampling(temperature=0, max_tokens=64))
    events = iter(handle)
    first = next(e for e in events if isinstance(e, Token) and e.text)
    handle.stop()
    final = next(events)
    assert isinstance(final, Done) and final.finish_reason == "aborted"
    assert final.reply.startswith(first.text)
    # Stopped after the engine ended it: every token is queued, and none is delivered.
    handle = engine.submit(messages, Sampling(temperature=0, max_tokens=16))
    events = iter(handle)
    first = next(e for e in events if isinstance(e, Token) and e.text)
    assert handle.wait(60) is not None
    handle.stop()
    final = next(events)
    assert isinstance(final, Done) and final.finish_reason == "length"
    assert final.reply.startswith(first.text) and len(final.reply) > len(first.text)


def test_21_leftover_a_remote_failing_after_a_mid_reply_hand_over_keeps_the_local_reply_and_exits_0(test_model_path, capsys, isolated_home):
    from fault_server import Status

    with FaultServer([Status(500), Status(500)]) as server:
        # Any real start is "uncertain" against these limits: the hand-over comes at the 4th token.
        remote_config(isolated_home, server.base_url,
                      "[remote.confidence]", "min_tokens = 4", "max_entropy = 0.0001")
        args = ("--max-tokens", "24", "What is the capital of France?")
        code, out, err = ask_here(capsys, test_model_path, "--json", *args)
        events = [json.loads(line) for line in out.splitlines()]
        kinds = [e["event"] for e in events]
        assert code == 0, err
        # The local reply stands: the text shown before the hand-over is restored, then what the
        # local model wrote before it stopped (unshown so far) comes as one last token.
        after = kinds[kinds.index("retract"):]
        assert after in (["retract", "restore", "notice", "done"],
                         ["retract", "restore", "notice", "token", "done"])
        notice = events[kinds.index("retract") + 2]
        assert notice["message"].endswith("; keeping the local reply up to the hand-over")
        assert events[-1]["route"] == "local" and events[kinds.index("restore")]["text"]

        code, out, err = ask_here(capsys, test_model_path, *args)
    assert code == 0 and "[stopped]" not in err
    assert "keeping the local reply up to the hand-over" in err
    local, marker, kept = out.split("\n", 2)
    assert marker.startswith("[local reply superseded") and kept.strip()


# -- issue 21: the engine, the store's exact text and the app ----------------------------------


@pytest.fixture(scope="module")
def looping_template_model(test_model_path, tmp_path_factory) -> Path:
    """The test model with a chat template that never finishes rendering: 10^10 steps of two
    nested loops (each range under the sandbox's cap), padded to the original's length."""
    data = bytearray(test_model_path.read_bytes())
    key = b"tokenizer.chat_template"
    at = data.index(key) + len(key) + 4  # the value's type (a u32: string) is skipped
    (length,) = struct.unpack_from("<Q", data, at)
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    template = (loop + "{#").ljust(length - 2, "-") + "#}"
    assert len(template.encode()) == length
    data[at + 8:at + 8 + length] = template.encode()
    path = tmp_path_factory.mktemp("gguf") / "looping-template.gguf"
    path.write_bytes(bytes(data))
    return path


def test_i21_05a_ask_with_a_template_that_never_finishes_is_one_line_within_seconds(looping_template_model, tmp_path):
    import time

    started = time.monotonic()
    code, _, err = localchat("ask", "-m", str(looping_template_model), "hi", home=tmp_path, timeout=60)
    assert code == 1 and "did not finish rendering" in the_error(err)
    assert time.monotonic() - started < 30


async def test_i21_05b_the_app_shows_a_template_that_never_finishes_and_ctrl_q_exits(looping_template_model):
    from fake_engine import SIZE, wait_until

    from localchat.engine.engine import Engine
    from localchat.engine.options import EngineOptions
    from localchat.store import Store
    from localchat.tui.app import LocalChatApp

    with Store.open() as store:
        app = LocalChatApp(store=store, list_models=list, sampling_factory=lambda: None,
                           engine_factory=lambda ref: Engine(looping_template_model,
                                                             EngineOptions(n_ctx=512), name="looper"))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.status.info.state == "no model", "the load to fail",
                             timeout=30)
            assert "did not finish rendering" in app.models.error
            await pilot.press("ctrl+q")
            await wait_until(pilot, lambda: not app.is_running, "the app to exit", timeout=10)


def test_i21_05c_ctrl_q_while_the_template_loops_ends_the_app_process(looping_template_model, tmp_path):
    import pty
    import select
    import time

    controller, terminal = pty.openpty()
    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path), "PYTHONPATH": str(REPO), "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "-m", str(looping_template_model)],
                            stdin=terminal, stdout=terminal, stderr=terminal, env=env,
                            start_new_session=True)
    os.close(terminal)
    try:
        drawn = b""
        while b"loading" not in drawn:  # the window is up and its model load has begun
            assert select.select([controller], [], [], 60)[0], "the app never drew its window"
            drawn += os.read(controller, 65536)
        os.write(controller, b"\x11")  # Ctrl+Q while the template is still rendering
        deadline = time.monotonic() + 30  # generous: it must not hang, however slow the machine
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([controller], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    os.read(controller, 65536)  # keep the terminal drained
        assert proc.poll() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)


def test_i21_12_a_reply_cut_inside_a_character_stores_what_was_shown(engine, greedy):
    from dataclasses import replace

    from localchat.events import Done, Token

    # Greedy SmolLM2 answers this with emoji, each several tokens of partial UTF-8; every cut
    # length is tried, so some end inside a character whatever the model writes.
    messages = [{"role": "user", "content": "Reply with three emoji only: 🐉🔥🍜"}]
    cut_inside = 0
    for max_tokens in range(1, 13):
        events = list(engine.submit(messages, replace(greedy, max_tokens=max_tokens)))
        done = events[-1]
        assert isinstance(done, Done)
        shown = "".join(e.text for e in events if isinstance(e, Token))
        assert done.reply == shown and "\ufffd" not in done.reply
        ids = [e.token_id for e in events if isinstance(e, Token) and e.token_id >= 0]
        cut_inside += engine.detokenize(ids).endswith("\ufffd")
    assert cut_inside  # the case under test was met


_HOLD_A_SNAPSHOT_WRITE = """
import sys, time
from pathlib import Path
from localchat.atomic import atomic_writer
with atomic_writer(Path(sys.argv[1])) as f:
    f.write(b"k" * int(sys.argv[2]))
    f.flush()
    print("writing", flush=True)
    time.sleep(600)
"""


def _snapshot_writer(target: Path, size: int) -> subprocess.Popen:
    """Another process in the middle of writing the snapshot ``target`` (``size`` bytes so far)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_A_SNAPSHOT_WRITE, str(target), str(size)],
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
    return proc


def test_i21_13_a_snapshot_temp_of_a_killed_writer_is_swept_and_one_being_written_counts_to_the_cap(
        test_model_path, capsys, isolated_home):
    import signal

    kv = isolated_home / "cache" / "kv"
    code, _, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "-s", "older", "hi")
    assert code == 0, err
    older = kv / "session-1.kvsnap"
    size = older.stat().st_size
    killed = _snapshot_writer(kv / "session-7.kvsnap", 800_000)  # SIGTERM mid-write:
    killed.send_signal(signal.SIGTERM)
    killed.wait(timeout=30)
    assert len(list(kv.glob(".session-7.kvsnap.*.tmp"))) == 1  # its temp file stays behind
    live = _snapshot_writer(kv / "session-8.kvsnap", 3 * size)
    try:
        # Room for two snapshots like the first, not for them and the one being written too.
        write_config(isolated_home, f"[snapshots]\nmax_bytes = {3 * size}\n")
        code, _, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "-s", "newer", "hi")
        assert code == 0, err
        assert [p.name.split(".tmp")[0][:18] for p in kv.glob(".*.tmp")] == [".session-8.kvsnap."]
        assert (kv / "session-2.kvsnap").is_file() and not older.exists()
    finally:
        live.kill()
        live.wait()


async def test_i21_16_turns_an_ask_stored_while_the_app_was_open_are_shown_before_its_reply(
        test_model_path, isolated_home):
    from fake_engine import FakeEngine, make_app, reply_finished, send, wait_until

    from localchat.store import Store
    from localchat.tui.chat_log import ReplyView, UserMessage

    with Store.open() as store:
        session = store.open_named_session("shared")
        store.add_exchange(session.id, "U1 in the app", "A1 in the app", model="m")
        engine = FakeEngine(reply="A3 in the app")
        app = make_app(store, engine, session="shared")
        async with app.run_test() as pilot:
            await wait_until(pilot, lambda: app.models.engine is not None, "the model to load")
            code, out, err = localchat("ask", "-m", str(test_model_path), "--max-tokens", "4",
                                       "-s", "shared", "U2 from ask", home=isolated_home)
            assert code == 0, err
            await send(pilot, "U3 in the app")
            await reply_finished(pilot)
            shown = [w.text for w in app.chat_log.children if isinstance(w, (UserMessage, ReplyView))]
        stored = [t.content for t in store.turns(session.id)]
    assert stored[2] == "U2 from ask" and stored == shown
    assert [m["content"] for m in engine.submitted[-1]][:4] == stored[:4]


# -- issue 38: faults round 4 -------------------------------------------------------------------


_COUNTING = "Write all the numbers from 1 to 1000, separated by commas. Do not stop early."


class _AppOnATerminal:
    """The app in a subprocess whose controlling terminal is a pseudo-terminal we hold: closing
    our side hangs the terminal up as closing its window does (the kernel sends SIGHUP)."""

    def __init__(self, model: Path, home: Path, *args: str, nohup: bool = False) -> None:
        import fcntl
        import pty
        import signal
        import termios

        def take_the_terminal() -> None:  # in the child, after setsid: the pty becomes its tty
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if nohup:  # started as `nohup localchat` would be: SIGHUP ignored
                signal.signal(signal.SIGHUP, signal.SIG_IGN)

        self.controller, terminal = pty.openpty()
        env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO), "TERM": "xterm"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localchat", "-m", str(model), *args], stdin=terminal,
            stdout=terminal, stderr=terminal, env=env, start_new_session=True,
            preexec_fn=take_the_terminal)
        os.close(terminal)
        self.drawn = b""

    def wait_for(self, text: bytes, timeout: float = 120) -> None:
        import select
        import time

        deadline = time.monotonic() + timeout
        while text not in self.drawn:
            assert time.monotonic() < deadline, f"never drew {text!r}"
            if select.select([self.controller], [], [], 0.2)[0]:
                self.drawn += os.read(self.controller, 65536)

    def type(self, text: str) -> None:
        os.write(self.controller, text.encode())

    def hang_up(self) -> None:
        os.close(self.controller)
        self.controller = -1

    def exit_status(self, timeout: float = 60) -> int:
        """Wait for the process, keeping the terminal drained; its exit status."""
        import select
        import time

        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if self.controller >= 0 and select.select([self.controller], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    self.drawn += os.read(self.controller, 65536)
            elif self.controller < 0:
                time.sleep(0.1)
        code = self.proc.poll()
        assert code is not None, "the app did not exit"
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.controller >= 0:
            os.close(self.controller)


def _stored_turns(home: Path) -> list[tuple[str, str, int]]:
    db = sqlite3.connect(home / "data" / "sessions.db")
    try:
        return db.execute("SELECT role, content, stopped FROM turns ORDER BY id").fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "closed terminal", "closed terminal, nohup"])
def test_38_1a_a_signal_or_a_closed_terminal_mid_reply_keeps_it_stopped_as_ctrl_q_does(
        how, test_model_path, tmp_path):
    import signal

    home = tmp_path / "home"
    write_config(home, "[sampling]\ntemperature = 0\nmax_tokens = 400\n")
    app = _AppOnATerminal(test_model_path, home, nohup=how.endswith("nohup"))
    try:
        app.wait_for(b"idle")
        app.type(_COUNTING + "\r")
        app.wait_for(b"generating")
        app.wait_for(b"10,", timeout=30)  # some of the reply is on the screen
        if how.startswith("closed terminal"):  # with SIGHUP ignored, the failed writes tell
            app.hang_up()
        else:
            app.proc.send_signal(getattr(signal, how))
        code = app.exit_status(timeout=30)
    finally:
        app.close()
    # As Ctrl+Q: the reply so far is kept, marked stopped; the status a signal gives.
    signum = signal.SIGTERM if how == "SIGTERM" else signal.SIGHUP
    assert code == 128 + signum
    turns = _stored_turns(home)
    assert [(role, stopped) for role, _, stopped in turns] == [("user", 0), ("assistant", 1)]
    assert turns[1][1].startswith("1, 2, 3")
    assert list((home / "cache" / "kv").glob("*.kvsnap"))  # the context was saved too
    if how == "SIGTERM":  # a terminal still there is left as it was found (alternate screen off)
        assert b"\x1b[?1049l" in app.drawn


def test_38_1b_ask_with_a_session_keeps_the_reply_stopped_on_sigterm(test_model_path, tmp_path):
    import signal

    home = tmp_path / "home"
    env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "ask", "-m", str(test_model_path),
                             "--temperature", "0", "--max-tokens", "400", "-s", "kept", _COUNTING],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        shown = b""
        while b"10," not in shown:  # some of the reply is out
            data = proc.stdout.read1(4096)
            assert data, "the reply never came"
            shown += data
        signum = signal.SIGTERM  # SIGHUP: test_38_1c, from a terminal that is closed
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err.decode() and "[stopped]" in err.decode()
    turns = _stored_turns(home)
    assert [(role, stopped) for role, _, stopped in turns] == [("user", 0), ("assistant", 1)]
    assert (shown + out).decode().strip() == turns[1][1].strip()  # what was shown is what is kept
    assert list((home / "cache" / "kv").glob("*.kvsnap"))  # and its context saved


@pytest.mark.parametrize("nohup", [False, True], ids=["SIGHUP", "SIGHUP ignored"])
def test_38_1c_ask_on_a_terminal_that_is_closed_mid_reply_keeps_it_stopped(nohup, test_model_path, tmp_path):
    import fcntl
    import pty
    import select
    import signal
    import termios
    import time

    def take_the_terminal() -> None:  # stdout is the terminal (stdin is not)
        fcntl.ioctl(1, termios.TIOCSCTTY, 0)
        if nohup:  # then only the failed writes tell that the terminal is gone
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

    home = tmp_path / "home"
    controller, terminal = pty.openpty()
    env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "ask", "-m", str(test_model_path),
                             "--temperature", "0", "--max-tokens", "400", "-s", "kept", _COUNTING],
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env,
                            start_new_session=True, preexec_fn=take_the_terminal)
    os.close(terminal)
    try:
        shown = b""
        while b"10," not in shown:
            assert select.select([controller], [], [], 60)[0], "the reply never came"
            shown += os.read(controller, 4096)
        os.close(controller)  # the window is closed: SIGHUP, and every later write fails
        controller = -1
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if controller >= 0:
            os.close(controller)
    assert proc.returncode == 128 + 1  # SIGHUP
    turns = _stored_turns(home)
    assert [(role, stopped) for role, _, stopped in turns] == [("user", 0), ("assistant", 1)]
    assert turns[1][1].startswith("1, 2, 3")


def test_38_2a_a_prompt_on_stdin_stops_at_the_4_mb_a_file_may_hold(test_model_path, tmp_path):
    import threading

    from localchat.user_files import MAX_BYTES

    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    with open(tmp_path / "err", "wb") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "localchat", "ask", "-m", str(test_model_path),
                                 "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=err_file, env=env)
        written = 0

        def produce() -> None:  # a producer that does not stop (bounded here at 64 MB)
            nonlocal written
            assert proc.stdin is not None
            with contextlib.suppress(OSError):
                while written < 64 * 1024 * 1024:
                    written += proc.stdin.write(b"word " * 13_107)
                proc.stdin.close()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        producer.join(timeout=10)
    err = (tmp_path / "err").read_text()
    assert code == 1 and the_error(err) == "localchat: error: stdin is over 4 MB; send a smaller prompt."
    # What it read is the cap, plus what the pipe holds: not what the producer would write.
    assert written < MAX_BYTES + 2 * 1024 * 1024


@pytest.mark.parametrize("payload", [chunk("word "), chunk("x" * 50_000)], ids=["tokens", "huge chunks"])
def test_38_2b_a_remote_ignoring_max_tokens_is_cut_at_the_users_limit_with_a_notice(payload):
    from fault_server import Endless

    from localchat.engine.options import Sampling
    from localchat.events import Done, Notice, Token
    from localchat.remote.client import RemoteClient
    from localchat.settings.remote import RemoteSettings

    with FaultServer([Stream([Endless(payload, limit=200_000)])]) as server:
        client = RemoteClient(RemoteSettings(mode="auto", base_url=server.base_url, timeout_s=5))
        events = list(client.stream([{"role": "user", "content": "hi"}], Sampling(max_tokens=16)))
        client.close()
    tokens = [e for e in events if isinstance(e, Token)]
    [notice] = [e for e in events if isinstance(e, Notice)]
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "length"
    assert 1 <= len(tokens) <= 16 and done.reply == "".join(t.text for t in tokens)
    assert "max_tokens" in notice.message and "16" in notice.message
    assert server.events_sent < 10_000  # the connection was closed: the server stopped too


def test_38_2b_a_remote_sending_empty_chunks_for_ever_is_not_read_for_ever():
    from fault_server import Endless

    from localchat.engine.options import Sampling
    from localchat.events import Failed
    from localchat.remote.client import RemoteClient
    from localchat.settings.remote import RemoteSettings

    empty = json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}}]})
    with FaultServer([Stream([chunk("Hi"), Endless(empty, limit=200_000)])]) as server:
        client = RemoteClient(RemoteSettings(mode="auto", base_url=server.base_url, timeout_s=5))
        events = list(client.stream([{"role": "user", "content": "hi"}], Sampling(max_tokens=16)))
        client.close()
    assert events[-1].reply == "Hi" and events[-1].finish_reason == "length"
    assert server.events_sent < 10_000
    with FaultServer([Stream([Endless(empty, limit=200_000)])]) as server:
        client = RemoteClient(RemoteSettings(mode="auto", base_url=server.base_url, timeout_s=5))
        events = list(client.stream([{"role": "user", "content": "hi"}], Sampling(max_tokens=16)))
        client.close()
    assert isinstance(events[-1], Failed) and "sent an empty reply" in events[-1].message
    assert server.events_sent < 10_000 and len(server.requests) == 1


def test_38_2c_ask_says_the_remote_went_past_max_tokens_and_keeps_what_it_asked_for(test_model_path, capsys, isolated_home):
    from fault_server import Endless

    with FaultServer([Stream([Endless(chunk("word "))])]) as server:
        remote_config(isolated_home, server.base_url)
        code, out, err = ask_here(capsys, test_model_path, "--route", "remote", "--max-tokens", "16",
                                  "-s", "s", "hi")
    host = server.base_url.split("//")[1].split("/")[0]
    assert code == 0 and "Traceback" not in err
    assert out == "word " * 16 + "\n"
    assert (f"localchat: the remote at {host} went on past the 16 tokens asked for (max_tokens); "
            "its reply was cut there") in err
    assert [(role, stopped) for role, _, stopped in _stored_turns(isolated_home)] == [
        ("user", 0), ("assistant", 0)]


_WEB_PAGE = (b"<!DOCTYPE html>\n<html><head><title>Sign in to the proxy</title></head>"
             b"<body>" + b"<p>Please sign in.</p>" * 200 + b"</body></html>")
_WHOLE_REPLY = json.dumps({"object": "chat.completion", "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}]})


@pytest.mark.parametrize("data, content_type, says", [
    pytest.param(_WEB_PAGE, "text/html; charset=utf-8",
                 "answered 200 with text/html (a web page), not a stream: '<!DOCTYPE html> <html>"
                 "<head><title>Sign in", id="web page"),
    pytest.param(_WHOLE_REPLY.encode(), "application/json",
                 'answered 200 with application/json (a whole reply: the server ignored "stream": '
                 "true), not a stream: '{\"object\": \"chat.completion\"", id="whole reply"),
    pytest.param(_WHOLE_REPLY.encode(), "text/event-stream",
                 "answered 200 with text/event-stream (a whole reply", id="JSON labelled a stream"),
    pytest.param(b'{"error": {"message": "no such model"}}', "application/json",
                 "answered 200 with application/json (an error object), not a stream: '{\"error\"",
                 id="error object"),
    pytest.param(b"", "text/event-stream",
                 "answered 200 with an empty body (text/event-stream), not a stream", id="empty body"),
    pytest.param(b"Service Unavailable\n", "",
                 "answered 200 with no content type, not a stream: 'Service Unavailable'",
                 id="plain text"),
])
def test_38_5a_a_2xx_answer_that_is_not_a_stream_is_named_for_what_it_is_and_not_retried(
        data, content_type, says):
    from fault_server import Body

    from localchat.events import Failed
    from localchat.remote.client import RemoteClient
    from localchat.settings.remote import RemoteSettings

    with FaultServer([Body(data, content_type)]) as server:
        client = RemoteClient(RemoteSettings(mode="auto", base_url=server.base_url, timeout_s=5))
        events = list(client.stream([{"role": "user", "content": "hi"}]))
        client.close()
    host = server.base_url.split("//")[1].split("/")[0]
    assert [type(e) for e in events] == [Failed]  # no retry notice before it
    assert events[0].message.startswith(f"the remote at {host} ")
    assert says in events[0].message and "\n" not in events[0].message
    assert len(server.requests) == 1


@pytest.mark.parametrize("steps, says", [
    ([json.dumps({"id": "x", "object": "chat.completion.chunk"})] * 3 + ["[DONE]"],
     "sent 3 events that are no chat-completion chunk (no 'choices'), the first: "),
    ([json.dumps({"text": "Hel"}), json.dumps({"text": "lo"})],
     "sent 2 events that are no chat-completion chunk (no 'choices'), the first: "),
    ([json.dumps({"choices": [{"index": 0, "delta": {"content": None}}]}),
      json.dumps({"choices": [{"index": 0, "delta": {"content": 42}, "finish_reason": "stop"}]}),
      "[DONE]"], "sent an empty reply: its 2 events carried no text"),
    ([json.dumps({"choices": "Hello"}), json.dumps({"choices": [7]}), "[DONE]"],
     "sent an empty reply: its 2 events carried no text"),
], ids=["no choices", "no choices and no [DONE]", "no text", "choices not objects"])
def test_38_5b_a_stream_without_usable_chunks_fails_and_nothing_empty_is_stored(
        steps, says, test_model_path, capsys, isolated_home):
    with FaultServer([Stream(steps)]) as server:
        remote_config(isolated_home, server.base_url)
        code, out, err = ask_here(capsys, test_model_path, "--route", "remote", "-s", "s", "hi")
    host = server.base_url.split("//")[1].split("/")[0]
    assert code == 1 and not out.strip()
    assert the_error(err).startswith(f"localchat: error: the remote at {host} {says}")
    assert len(server.requests) == 1
    assert not (isolated_home / "data" / "sessions.db").exists() or _stored_turns(isolated_home) == []


def test_38_5c_an_auto_turn_falls_back_to_the_local_model_with_the_remotes_answer_named(
        test_model_path, capsys, isolated_home):
    from fault_server import Body

    with FaultServer([Body(_WEB_PAGE)]) as server:
        remote_config(isolated_home, server.base_url)
        code, out, err = ask_here(
            capsys, test_model_path, "--max-tokens", "4", "--json", "--route", "auto",
            "Prove step by step that the square root of 2 is irrational, with a rigorous "
            "proof by contradiction, and explain each step of the proof in detail.")
    events = [json.loads(line) for line in out.splitlines()]
    [fallback] = [e for e in events if e["event"] == "notice" and e["kind"] == "fallback"]
    assert code == 0 and "(a web page), not a stream" in fallback["message"]
    assert "closed the stream" not in fallback["message"]
    assert events[-1]["event"] == "done" and events[-1]["route"] == "local"
    assert len(server.requests) == 1


def test_38_3a_import_copies_the_file_so_rewriting_the_original_leaves_the_model_as_imported(tmp_path):
    from hub_server import make_gguf

    home = tmp_path / "home"
    original = tmp_path / "downloads" / "tiny.gguf"
    original.parent.mkdir()
    original.write_bytes(make_gguf())
    imported = home / "data" / "models" / "imported"
    imported.mkdir(parents=True)
    for stale in (".old.gguf.k3j2h1.tmp", ".older.gguf.999999999.importing"):  # killed imports'
        (imported / stale).write_bytes(b"half a copy")
    code, out, err = localchat("import", str(original), home=home, timeout=60)
    assert code == 0, err
    stored = home / "data" / "models" / "imported" / "tiny.gguf"
    assert stored.stat().st_ino != original.stat().st_ino and stored.stat().st_nlink == 1
    assert [p.name for p in stored.parent.iterdir()] == ["tiny.gguf"]  # no temp file, old or new
    with open(original, "r+b") as f:  # a new download written over the original, in place
        f.truncate(100)
        f.write(b"new bytes")
    assert stored.read_bytes() == make_gguf()
    code, out, err = localchat("models", "--json", home=home, timeout=60)
    row = {r["name"]: r for r in json.loads(out)}["tiny"]
    assert row["downloaded"] and row["size_bytes"] == len(make_gguf())


def test_38_3b_an_imported_model_whose_file_changed_says_so_at_load(test_model_path, tmp_path):
    home = tmp_path / "home"
    original = tmp_path / "user" / "small.gguf"  # never the shared test model: this test writes
    original.parent.mkdir()
    shutil.copyfile(test_model_path, original)
    code, out, err = localchat("import", str(original), "--name", "small", home=home)
    assert code == 0, err
    stored = home / "data" / "models" / "imported" / "small.gguf"
    with open(stored, "ab") as f:  # changed in the models folder (or through an old hard link)
        f.write(b"\0" * 4096)
    code, out, err = localchat("ask", "-m", "small", "--max-tokens", "2", "hi", home=home)
    size = test_model_path.stat().st_size
    assert code == 0 and out.strip(), err
    assert (f"localchat: small's file changed since it was imported ({size:,} bytes then, "
            f"{size + 4096:,} now): {stored}") in err


def test_38_3c_import_onto_a_disk_without_room_is_one_line_and_leaves_nothing(test_model_path, tmp_path):
    home = tmp_path / "home"
    models = home / "data" / "models"
    with tmpfs(models, "16m"):
        code, out, err = localchat("import", str(test_model_path), "--name", "small", home=home)
        assert code == 1 and "not enough disk space" in the_error(err)
        assert list(models.rglob("*")) in ([], [models / "imported"])
    assert not (home / "models.toml").exists()


def test_38_4_a_cancelled_hub_pull_is_listed_as_partial_and_rm_and_pull_act_on_it(
        monkeypatch, capsys, isolated_home):
    from hub_server import FakeHub, make_gguf

    from localchat.models.progress import format_bytes

    ref, content = "hf:acme/Tiny-GGUF/tiny.gguf", make_gguf()
    assert _stalled_pull(monkeypatch, ref, content) == 1
    [part] = list((isolated_home / "data" / "models").rglob("tiny.gguf.*.part"))
    size = part.stat().st_size
    assert 0 < size < len(content)

    code, out, err = localchat("models", "--json", home=isolated_home)
    row = {r["name"]: r for r in json.loads(out)}[ref]
    assert code == 0 and not row["downloaded"] and row["partial"] and row["partial_bytes"] == size
    empty = isolated_home / "data" / "models" / "acme--Other-GGUF" / "other.gguf.0123abcd.part"
    empty.parent.mkdir()
    empty.touch()  # cut off before its first block was written: a leftover all the same
    code, out, err = localchat("models", home=isolated_home)
    [line] = [line for line in out.splitlines() if line.startswith(ref)]
    assert "partial" in line and f"{format_bytes(size)} so far" in line
    [line] = [line for line in out.splitlines() if line.startswith("hf:acme/Other-GGUF/other.gguf")]
    assert "partial" in line and "0 B so far" in line
    empty.unlink()
    code, out, err = localchat("doctor", "--json", home=isolated_home)
    assert json.loads(out)["models"]["partial"] == [{"name": ref, "path": str(part), "size_bytes": size}]
    code, out, err = localchat("doctor", home=isolated_home)
    assert f"{ref} ({format_bytes(size)} so far" in out

    code, out, err = localchat("rm", ref, home=isolated_home)
    assert code == 0 and f"deleted {ref} ({format_bytes(size)} freed)" in out
    assert not part.exists()
    code, out, err = localchat("models", "--json", home=isolated_home)
    assert ref not in {r["name"] for r in json.loads(out)}

    assert _stalled_pull(monkeypatch, ref, content) == 1  # cancelled again; this time, resumed
    with FakeHub() as hub:
        hub.add_file("acme/Tiny-GGUF", "tiny.gguf", content)
        code, out, err = localchat("pull", ref, home=isolated_home, env=_hub_env(hub))
    assert code == 0, err
    assert hub.cdn_gets()[0].range_start == size
    assert (isolated_home / "data" / "models" / "acme--Tiny-GGUF" / "tiny.gguf").read_bytes() == content


@pytest.mark.parametrize("name", ["config.toml", "models.toml"])
@pytest.mark.parametrize("kind, says", [
    pytest.param("dangling", "is a symbolic link to ", id="dangling"),
    pytest.param("loop", "is a symbolic link that loops back on itself", id="loop"),
    pytest.param("fifo", "is not a regular file", id="fifo"),
])
def test_38_6a_a_settings_file_that_is_a_broken_link_is_refused_naming_it(name, kind, says, test_model_path, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    path = home / name
    if kind == "dangling":  # say, a dotfiles checkout that moved: [snapshots] enabled = false was there
        path.symlink_to(tmp_path / "dotfiles" / name)
    elif kind == "loop":
        path.symlink_to(path)
    else:
        os.mkfifo(path)  # reading it would wait for a writer for ever
    code, out, err = localchat("ask", "-m", str(test_model_path), "--max-tokens", "2", "-s", "s",
                               "hi", home=home, timeout=60)
    assert code == 1 and not out
    assert the_error(err).startswith(f"localchat: error: {path} {says}")
    assert not (home / "cache" / "kv").exists() and not (home / "data" / "sessions.db").exists()


@pytest.mark.parametrize("link, says", [
    pytest.param("dangling", "is a symbolic link to ", id="dangling"),
    pytest.param("loop", "is a symbolic link that loops back on itself", id="loop"),
])
def test_38_6a_a_session_database_that_is_a_broken_link_says_so(link, says, tmp_path):
    data = tmp_path / "home" / "data"
    data.mkdir(parents=True)
    database = data / "sessions.db"
    database.symlink_to(tmp_path / "gone" / "sessions.db" if link == "dangling" else database)
    code, out, err = localchat("sessions", home=tmp_path / "home", timeout=60)
    assert code == 1 and the_error(err).startswith(
        f"localchat: error: The session database {database} {says}")


def test_38_6b_a_settings_file_starting_with_a_byte_order_mark_is_read(test_model_path, capsys, isolated_home):
    write_config(isolated_home, "\ufeff[snapshots]\nenabled = false\n")  # as Notepad saves it
    (isolated_home / "models.toml").write_text('\ufeff[models.small]\npath = "small.gguf"\n')
    code, out, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "-s", "s", "hi")
    assert code == 0 and out.strip(), err
    assert not list((isolated_home / "cache" / "kv").glob("*.kvsnap"))  # the setting was read
    code, out, err = localchat("models", "--json", home=isolated_home)
    assert code == 0 and "small" in {row["name"] for row in json.loads(out)}, err
    (isolated_home / "config.toml").write_text("[snapshots]\nenabled = false\n", encoding="utf-16")
    code, out, err = localchat("models", home=isolated_home)
    assert code == 1 and "is UTF-16 text" in the_error(err)


def test_38_6c_a_truncated_gguf_given_by_path_says_so_on_every_load(test_model_path, tmp_path, capsys):
    from localchat.models.gguf import read_gguf

    cut = tmp_path / "cut.gguf"
    data = test_model_path.read_bytes()
    cut.write_bytes(data[:len(data) * 2 // 3])  # a download or copy still under way
    code, out, err = ask_here(capsys, cut, "--max-tokens", "2", "hi")
    needed = read_gguf(test_model_path).data_end
    assert code == 1 and not out
    assert the_error(err) == (f"localchat: error: {cut} is truncated: its tensors need {needed} "
                              f"bytes but the file has {cut.stat().st_size} (an interrupted "
                              "download or copy?)")


def test_38_6d_a_file_ending_inside_a_character_is_read_up_to_it_and_one_bad_inside_is_refused(
        test_model_path, tmp_path, capsys):
    growing = tmp_path / "growing.txt"
    growing.write_bytes("Le café coûte 2 €".encode()[:-2])  # the writer is half-way through "€"
    code, out, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "--json", "-f",
                              str(growing), "Summarise the file.")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and events[-1]["event"] == "done", err
    notes = [e["message"] for e in events if e["event"] == "notice"]
    assert ("growing.txt ends inside a character (is it still being written?): read up to its "
            "last whole character") in notes

    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"caf\xe9 au lait, and more text after it")
    code, out, err = ask_here(capsys, test_model_path, "--max-tokens", "2", "-f", str(broken), "hi")
    assert code == 1 and "broken.txt is not UTF-8 text (byte 3 is not)" in the_error(err)


def test_38_7a_reasoning_is_dimmed_only_on_a_terminal_that_can_show_it(test_model_path, tmp_path):
    home = tmp_path / "home"
    thought = json.dumps({"object": "chat.completion.chunk", "model": "m", "choices": [
        {"index": 0, "delta": {"reasoning_content": "Let me think."}, "finish_reason": None}]})
    stream = Stream([thought, chunk("Paris."), chunk(finish_reason="stop"), "[DONE]"])
    with FaultServer([stream]) as server:
        remote_config(home, server.base_url)
        args = ("ask", "-m", str(test_model_path), "--route", "remote", "Capital of France?")
        shown = {term: on_a_terminal(*args, home=home, env={"TERM": term})
                 for term in ("dumb", "xterm-256color")}
        code, piped, err = localchat(*args, home=home, env={"TERM": "xterm-256color"})
    assert all(code == 0 and "Let me think." in text and "Paris." in text
               for code, text in shown.values()), shown
    assert "\x1b" not in shown["dumb"][1]  # not even around the reasoning
    assert "\x1b[2mLet me think.\x1b[22m" in shown["xterm-256color"][1]  # the dimming still works
    assert code == 0 and "\x1b" not in err + piped and "Let me think." in err


_LOG_HARD = """
import logging, sys
from localchat import logs
logs.MAX_BYTES = 400  # a rotation every other record: the race is met in most rounds
logs.attach()
log = logging.getLogger("localchat.test")
for i in range(100):
    log.warning("process %s record %d %s", sys.argv[1], i, "x" * 100)
"""


def test_38_7b_processes_logging_at_once_never_print_logging_errors(tmp_path):
    import re

    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    for _ in range(5):
        procs = [subprocess.Popen([sys.executable, "-c", _LOG_HARD, str(n)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env) for n in range(3)]
        outputs = [proc.communicate(timeout=120) for proc in procs]
        for proc, (out, err) in zip(procs, outputs):
            assert proc.returncode == 0 and out == b"" and err == b"", err.decode()[-2000:]
    logs = sorted((tmp_path / "home" / "data").glob("localchat.log*"))
    assert [f.name for f in logs] == ["localchat.log", "localchat.log.1", "localchat.log.2"]
    record = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING localchat.test "
                        r"\[MainThread\] process \d record \d+ x{100}$")
    for log in logs:  # each within the cap, and made of whole records
        assert log.stat().st_size <= 400
        assert all(record.match(line) for line in log.read_text().splitlines()), log


# --- round 5 (issue 46) --------------------------------------------------------------------------


def test_46_10_a_huge_line_on_a_tool_servers_stderr_stays_within_the_log_cap():
    import asyncio
    import logging

    from localchat import logs, paths
    from localchat.tools.mcp_server import StderrTail

    tail = StderrTail("blob")
    assert tail.writer is not None
    tail.writer.write("x" * 20_000_000 + "\nlast words\n")
    tail.spawned()  # our end closed: the reading ends with the pipe
    assert asyncio.run(tail.last_line(wait=30)) == "last words"
    logging.getLogger("localchat.test").warning("%s", "y" * 5_000_000)  # any record, not only stderr
    files = sorted(paths.log_file().parent.glob("localchat.log*"))
    assert files and all(f.stat().st_size <= logs.MAX_BYTES for f in files)
    logged = "".join(f.read_text() for f in files)
    assert "x" * 4000 in logged and "more characters" in logged and "last words" in logged
    assert "bytes cut" in logged and len(logged) < 100_000


def _ask_on_a_terminal(model: Path, home: Path, script: list, config: str, *args: str):
    """``ask`` in a subprocess whose controlling terminal is a pseudo-terminal we hold (its stdin
    too), against a scripted remote; yields (proc, controller fd)."""
    import fcntl
    import pty
    import termios

    from fault_server import FaultServer

    def take_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    @contextlib.contextmanager
    def running():
        with FaultServer(script) as server:
            home.mkdir(parents=True, exist_ok=True)
            (home / "config.toml").write_text(
                f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n\n{config}')
            controller, terminal = pty.openpty()
            env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
            proc = subprocess.Popen(
                [sys.executable, "-m", "localchat", "ask", "--route", "remote", "--model", str(model),
                 "--max-tokens", "16", "--json", *args, "Go."],
                stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True, preexec_fn=take_the_terminal)
            os.close(terminal)
            try:
                yield proc, controller
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                os.close(controller)

    return running()


def _read_until(fd: int, text: bytes, timeout: float = 60) -> bytes:
    import select
    import time

    seen = b""
    deadline = time.monotonic() + timeout
    while text not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"the terminal never showed {text!r}: {seen!r}")
        try:
            seen += os.read(fd, 4096)
        except OSError:  # the process closed the terminal
            raise AssertionError(f"the terminal closed before {text!r}: {seen!r}") from None
    return seen


def test_46_1a_ask_puts_the_question_on_its_controlling_terminal(test_model_path, tmp_path):
    from fault_server import reply
    from test_remote_tools import calls_stream

    notes = tmp_path / "notes.txt"
    notes.write_text("tangerine")
    script = [calls_stream(("call_1", "read_file", json.dumps({"path": str(notes)}))),
              reply("It is tangerine.")]
    with _ask_on_a_terminal(test_model_path, tmp_path / "home", script,
                            '[tools]\nbuiltins = ["read_file"]\n') as (proc, controller):
        asked = _read_until(controller, b"[n] no: ")
        assert b"builtin.read_file" in asked and str(notes).encode() in asked
        os.write(controller, b"y\r")
        out, err = proc.communicate(timeout=60)
    events = [json.loads(line) for line in out.splitlines()]
    results = [e["content"] for e in events if e["event"] == "tool_result"]
    assert proc.returncode == 0 and results == ["tangerine"], err.decode()[-2000:]
    assert b"no terminal to ask" not in err


def test_46_3_a_small_ram_cache_restores_a_conversation_its_save_would_evict(engine, fresh):
    # `serve --cache-ram 12`: conversation A saved, B live, then A continued. Saving B (to take A
    # back) must evict A to fit; the pool picked A first and then failed to remove it (a 500).
    from oracle import GREEDY, assert_matches_fresh, reply_tokens

    from localchat.engine.state_pool import StatePool

    pool = StatePool(12 * 1024**2)

    def chat(topic: str) -> list[dict]:
        return [{"role": "user", "content": f"Tell me about the {topic}. " * 45}]

    def turn(messages: list[dict]) -> list[int]:
        tokens, _ = reply_tokens(engine.submit(messages, GREEDY, pool=pool))
        assert pool.size_bytes <= pool.cap_bytes
        return tokens

    a, b = chat("sea"), chat("mountains")
    first = turn(a)
    turn(b)  # A saved to the pool
    assert len(pool) == 1
    a_again = a + [{"role": "assistant", "content": engine.detokenize(first)},
                   {"role": "user", "content": "And the fish?"}]
    assert_matches_fresh(turn(a_again), fresh, a_again)
    assert pool.restored == 1 and len(pool) == 1  # A taken back, B saved in its place


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_46_1b_ask_in_tmux_shows_the_whole_command_before_asking(test_model_path, tmp_path):
    import shlex
    import time
    import uuid

    from fault_server import FaultServer, reply
    from test_remote_tools import calls_stream

    marker = tmp_path / "marker"
    command_ = "echo " + "a" * 300 + f"; touch {marker}"
    script = [calls_stream(("call_1", "run_command", json.dumps({"command": command_}))),
              reply("Done.")]
    home = tmp_path / "home"
    socket_name = f"localchat-test-{uuid.uuid4().hex[:8]}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket_name, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=30).stdout

    with FaultServer(script) as server:
        home.mkdir(parents=True)
        (home / "config.toml").write_text(
            f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n\n'
            '[tools]\nbuiltins = ["run_command"]\n')
        ask = [sys.executable, "-m", "localchat", "ask", "--route", "remote", "--model",
               str(test_model_path), "--max-tokens", "16", "Go."]
        line = (f"env LOCALCHAT_HOME={shlex.quote(str(home))} PYTHONPATH={shlex.quote(str(REPO))} "
                f"{shlex.join(ask)} 2>{shlex.quote(str(tmp_path / 'err'))}; "
                f"echo exit=$? > {shlex.quote(str(tmp_path / 'status'))}")
        tmux("new-session", "-d", "-x", "200", "-y", "50", line)
        try:
            deadline = time.monotonic() + 60
            while "[n] no:" not in (shown := tmux("capture-pane", "-p", "-J")):
                assert time.monotonic() < deadline, f"never asked: {shown}"
                time.sleep(0.1)
            assert command_ in shown.replace("\n", "")  # the whole command, its tail included
            tmux("send-keys", "n", "Enter")
            while not (tmp_path / "status").exists():
                assert time.monotonic() < deadline + 30, "ask did not end"
                time.sleep(0.1)
        finally:
            tmux("kill-server")
    assert (tmp_path / "status").read_text().strip() == "exit=0"
    assert not marker.exists()  # denied: nothing ran
    err = (tmp_path / "err").read_text()
    assert f"touch {marker}" in err and "Traceback" not in err  # the ⚙ line is whole too


def test_46_5_a_catastrophic_pattern_is_checked_within_a_bound(test_model_path, tmp_path):
    # The answer (from a remote here: the grammar keeps a local one inside the pattern) is checked
    # against the schema after it ends; Python's re ran ^(a+)+$ on 36 a's and a "!" for hours,
    # deaf to SIGINT and SIGTERM. ^(a|a)*$ defeats even a smarter backtracking engine: it is cut
    # off and said to be too slow.
    import time

    from fault_server import FaultServer, reply

    for pattern, said in (("^(a+)+$", "does not match the pattern"), ("^(a|a)*$", "took too long to check")):
        schema = json.dumps({"type": "object", "required": ["a"],
                             "properties": {"a": {"type": "string", "pattern": pattern}}})
        with FaultServer([reply(json.dumps({"a": "a" * 36 + "!"}))]) as server:
            home = tmp_path / pattern.count("|").__str__()
            home.mkdir()
            (home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{server.base_url}"\n')
            env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO)}
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "localchat", "ask", "--route", "remote",
                                   "--model", str(test_model_path), "--schema", schema, "Go."],
                                  capture_output=True, text=True, env=env, timeout=120)
        assert time.monotonic() - started < 60
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert said in proc.stderr and pattern in proc.stderr


@pytest.mark.parametrize("flag", ["--schema", "--grammar", "-f"])
def test_46_9_files_given_for_a_shape_are_read_as_attachments_are(flag, tmp_path):
    # --schema DIR, --schema <(echo …) and --schema /dev/zero all said "does not exist";
    # --grammar /dev/zero read until MemoryError. One reader now: a pipe is read (with a cap),
    # a directory or a device is named as such.
    content = {"--schema": '{"type": "object", "properties": {"ok": {"type": "boolean"}}}',
               "--grammar": 'root ::= "yes" | "no"', "-f": "some notes"}[flag]
    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}

    def ask(target: str) -> subprocess.CompletedProcess:
        # A model that does not exist: what is read of the file is said before any model loads.
        line = f'{sys.executable} -m localchat ask --model no-such-model {flag} {target} "hi"'
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, timeout=60)

    for target, said in ((str(tmp_path), "is a directory"), ("/dev/zero", "is a device")):
        proc = ask(target)
        assert proc.returncode != 0 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    piped = ask(f"<(printf '%s' '{content}')")  # bash's process substitution: a pipe
    assert "no-such-model" in piped.stderr and "Traceback" not in piped.stderr, piped.stderr
    endless = ask("<(yes)")
    assert endless.returncode != 0 and "over 4 MB" in endless.stderr and "Traceback" not in endless.stderr

def test_46_2a_a_lone_surrogate_in_a_message_is_a_400_naming_the_field(serve_host):
    # JavaScript that cuts a string inside an emoji sends half of its UTF-16 pair ("\ud83d"): a
    # client's mistake, answered 500 ("engine error: UnicodeEncodeError"), which SDKs retry.
    from serve_fixtures import post, raw, running

    cut = b'{"messages": [{"role": "user", "content": "Hi \\ud83d"}], "max_tokens": 2}'
    whole = b'{"messages": [{"role": "user", "content": "Hi \\ud83d\\ude00"}], "max_tokens": 2}'
    with running(serve_host) as app:
        status, _, body = raw(app, post("/v1/chat/completions", cut))
        error = json.loads(body)["error"]
        assert status == 400 and error["param"] == "messages[0].content", body
        assert "lone UTF-16 surrogate" in error["message"] and "\\ud83d" in error["message"]
        status, _, body = raw(app, post("/api/chat", cut))
        assert status == 400 and "messages[0].content" in json.loads(body)["error"]
        assert raw(app, post("/v1/chat/completions", whole))[0] == 200  # a whole pair is a character


def test_46_2b_a_conversation_the_template_rejects_is_a_400_in_the_templates_words(test_model_path):
    # Mistral/Gemma-style templates raise_exception() for two user messages in a row or a system
    # message in the middle: the client's conversation, answered 500 (retried three times by the
    # openai SDK). llama-server answers 400.
    from dataclasses import replace

    import openai
    from llama_cpp.llama_chat_format import MISTRAL_INSTRUCT_CHAT_TEMPLATE
    from serve_fixtures import MODEL, running

    from localchat.models.registry import resolve_model
    from localchat.serve.model_host import ModelHost
    from localchat.settings import Settings

    spec = replace(resolve_model(str(test_model_path)), name=MODEL,
                   chat_template=MISTRAL_INSTRUCT_CHAT_TEMPLATE)
    host = ModelHost(Settings(), spec, n_ctx=512)
    host.acquire(host.default())
    try:
        with running(host) as app:
            client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=3)
            twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
            with pytest.raises(openai.BadRequestError) as caught:  # a 400: never retried
                client.chat.completions.create(model=MODEL, messages=twice, max_tokens=2)
            error = caught.value.body
            assert error["param"] == "messages" and error["type"] == "invalid_request_error"
            assert error["message"] == ("the chat template rejected the conversation: "
                                        "Conversation roles must alternate user/assistant/user/"
                                        "assistant/...")
            with pytest.raises(openai.BadRequestError, match="Only user and assistant roles"):
                client.chat.completions.create(model=MODEL, stream=True, max_tokens=2, messages=[
                    {"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
            reply = client.chat.completions.create(model=MODEL, max_tokens=2, messages=twice[:1])
            assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        host.unload()


def test_46_8_an_api_key_no_client_could_send_is_refused_at_start(tmp_path):
    # Headers are read as Latin-1 and a bearer's trailing space is stripped: with such a key the
    # server started and answered every client 401.
    for args, env, says in [
        (["--api-key", "clé-secrète"], {}, "--api-key must be printable ASCII"),
        (["--api-key", "s3cret "], {}, "--api-key must not begin or end with whitespace"),
        ([], {"LOCALCHAT_API_KEY": "\ts3cret"}, "LOCALCHAT_API_KEY must not begin or end with"),
        ([], {"LOCALCHAT_API_KEY": "s3cr\x7fet"}, "LOCALCHAT_API_KEY must be printable ASCII"),
    ]:
        code, out, err = localchat("serve", "--port", "0", *args, home=tmp_path / "home",
                                   env=env, timeout=60)
        assert code == 1 and says in the_error(err) and err.count("\n") == 1, err
        assert "localchat serve: http" not in out
    write_config(tmp_path / "home", '[serve]\napi_key = "s3cret"\n')
    code, _, err = localchat("serve", "--port", "0", home=tmp_path / "home", timeout=60)
    assert code == 1 and "set LOCALCHAT_API_KEY" in the_error(err)


def test_46_4_a_huge_schema_is_refused_and_a_slow_one_converts_while_others_are_answered(
        serve_host, monkeypatch):
    # A 1 MB response_format (30,000 optional properties) was turned into a grammar on the event
    # loop: /health and every other client froze for 13 s, more for a larger schema.
    import threading
    import time

    from serve_fixtures import get, post, raw, running

    from localchat.formats import schema_format
    from localchat.serve import tool_fields
    from localchat.serve.http import Limits

    def shaped(n: int) -> dict:
        schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}
        return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "big", "schema": schema}}}

    def slow_schema_format(schema, name=""):
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # a conversion that takes its time, in Python
            pass
        return schema_format(schema, name)

    limits = Limits(max_body_bytes=8 * 1024**2, request_timeout_s=5.0, idle_timeout_s=5.0)
    with running(serve_host, limits=limits) as app:
        started = time.monotonic()
        status, _, body = raw(app, post("/v1/chat/completions", shaped(30_000)))
        error = json.loads(body)["error"]
        assert status == 400 and error["param"] == "response_format", body
        assert error["message"] == ("response_format: the schema has 30,000 properties; at "
                                    "most 5,000")
        assert time.monotonic() - started < 3

        monkeypatch.setattr(tool_fields, "schema_format", slow_schema_format)
        seconds, answers = 2.0, []
        chat = threading.Thread(target=lambda: answers.append(
            raw(app, post("/v1/chat/completions", shaped(3)))))
        chat.start()
        time.sleep(0.2)
        for _ in range(5):  # while the schema converts
            asked = time.monotonic()
            assert raw(app, get("/health"))[0] == 200
            assert time.monotonic() - asked < 0.5
            time.sleep(0.1)
        assert chat.is_alive()
        chat.join(30)
        assert answers[0][0] == 200

        monkeypatch.setattr(tool_fields, "SCHEMA_LIMIT_S", 0.3)  # a conversion past its deadline
        seconds = 30.0
        started = time.monotonic()
        status, _, body = raw(app, post("/v1/chat/completions", shaped(3)))
        assert status == 400 and time.monotonic() - started < 5
        assert json.loads(body)["error"]["message"] == (
            "response_format: the schema took over 0.3 s to turn into a grammar; make it smaller "
            "or simpler")


@contextlib.contextmanager
def _serving(model: Path, home: Path, preexec_fn=None):
    """``localchat serve`` in a subprocess on a free port; yields (process, port, stderr file).
    Its stderr goes to a file: thousands of tracebacks would fill a pipe and stall it."""
    import re
    import signal

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1"}
    stderr = home / "serve-stderr.txt"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localchat", "serve", "--model", str(model), "--port", "0",
             "--n-ctx", "256"], stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            preexec_fn=preexec_fn)
    try:
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found, line + stderr.read_text()
        yield proc, int(found.group(1)), stderr
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ask_serve(port: int, data: bytes) -> tuple[int, dict]:
    """One request's bytes on a new connection; the answer's status and JSON body."""
    import socket

    from serve_fixtures import read_response

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        status, _, body = read_response(sock)
    return status, json.loads(body)


def test_46_7_a_content_length_in_other_digits_is_a_400_not_a_traceback(test_model_path,
                                                                          tmp_path):
    # Read as Latin-1, byte 0xB2 is "²": str.isdigit() says yes, int() says no, and the
    # ValueError dropped the connection with a traceback on serve's terminal.
    with _serving(test_model_path, tmp_path / "home") as (proc, port, stderr):
        for length in (b"\xb2", b"\xb9\xb3", b"1\xb2"):
            status, body = _ask_serve(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: "
                                            b"localhost\r\nContent-Length: " + length + b"\r\n\r\n")
            assert status == 400 and "Content-Length" in body["error"]["message"], body
        assert _ask_serve(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")[0] == 200
    assert proc.returncode == 0
    assert "Traceback" not in stderr.read_text(), stderr.read_text()


def test_46_6_out_of_file_descriptors_the_server_keeps_answering_and_says_so_once(
        test_model_path, tmp_path):
    # `ulimit -n 128` and 200 idle connections: /health failed meanwhile and serve's stderr got
    # thousands of tracebacks ("socket.accept() out of system resource") in 4 s.
    import resource
    import socket
    import time

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    health = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with _serving(test_model_path, tmp_path / "home", preexec_fn=few_files) as (_, port, stderr):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(200)]
        try:
            time.sleep(2)
            started = time.monotonic()
            assert _ask_serve(port, health)[0] == 200
            assert time.monotonic() - started < 5
            status, body = _ask_serve(port, b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\n"
                                            b"Content-Length: 2\r\n\r\n{}")
            assert status == 400  # a request that needs work too (not only /health)
            time.sleep(1)
        finally:
            for sock in idle:
                sock.close()
        assert _ask_serve(port, health)[0] == 200
    said = stderr.read_text()
    assert "Traceback" not in said, said[-3000:]
    assert len(said.splitlines()) <= 3, said[-3000:]  # the warning once (and "stopped")
