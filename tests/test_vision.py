"""Whether images can be read: the libmtmd probe (engine/vision.py) and what doctor says of it."""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
import pytest

from localchat.cli import main
from localchat.engine import vision


@pytest.fixture(autouse=True)
def fresh_probe():
    """The probe is cached per process: each test asks again."""
    vision.image_support.cache_clear()
    yield
    vision.image_support.cache_clear()


def _bundles_mtmd() -> bool:
    return any((Path(llama_cpp.__file__).parent / "lib").glob("libmtmd.*"))


def _fail_to_load(monkeypatch, exc: Exception) -> None:
    def load() -> None:
        raise exc
    monkeypatch.setattr(vision, "load_mtmd", load)


def test_images_are_available_when_libmtmd_loads(monkeypatch):
    monkeypatch.setattr(vision, "load_mtmd", lambda: None)
    support = vision.image_support()
    assert support.available and str(support) == "available (libmtmd)"


def test_a_build_without_libmtmd_makes_images_unavailable_in_one_line(monkeypatch):
    _fail_to_load(monkeypatch, FileNotFoundError("Shared library with base name 'mtmd' not found"))
    monkeypatch.setattr("localchat.engine.gpu.has_bundled_library", lambda package, name: False)
    support = vision.image_support()
    assert not support.available
    assert str(support) == ("unavailable: this llama-cpp-python was built without libmtmd "
                            "(LLAVA_BUILD=OFF); rebuild with scripts/test (or scripts/build-llama)")


def test_a_libmtmd_that_does_not_load_says_why(monkeypatch):
    _fail_to_load(monkeypatch, OSError("libmtmd.so: undefined symbol: clip_init\nmore"))
    monkeypatch.setattr("localchat.engine.gpu.has_bundled_library", lambda package, name: True)
    support = vision.image_support()
    assert not support.available
    assert "libmtmd did not load (libmtmd.so: undefined symbol: clip_init)" in support.reason
    assert "\n" not in support.reason


def test_the_real_probe_agrees_with_the_bundled_library():
    # With this venv's own build: images are available exactly when libmtmd was built.
    assert vision.image_support().available == _bundles_mtmd()


def test_doctor_says_whether_images_are_available(monkeypatch, capsys):
    _fail_to_load(monkeypatch, FileNotFoundError("no mtmd"))
    monkeypatch.setattr("localchat.engine.gpu.has_bundled_library", lambda package, name: False)
    assert main(["doctor", "--json"]) == 0
    images = json.loads(capsys.readouterr().out)["images"]
    assert images["available"] is False and "built without libmtmd" in images["reason"]
    assert main(["doctor"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("images"))
    assert "unavailable: this llama-cpp-python was built without libmtmd" in line


def test_doctor_json_reports_available_images(monkeypatch, capsys):
    monkeypatch.setattr(vision, "load_mtmd", lambda: None)
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == {"available": True,
                                                             "reason": "libmtmd"}
