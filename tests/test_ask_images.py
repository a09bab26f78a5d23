"""`localchat ask --image PATH`: pictures attached to the question, end to end with the real
engine and the synthetic projector; bad pictures refused in one line before a model loads."""

from __future__ import annotations

import json

import pytest
from image_fixture import gif, png
from projector_fixture import write_mlp_projector

from localchat.cli import main
from localchat.engine.vision import image_support

needs_mtmd = pytest.mark.skipif(not image_support().available, reason="no libmtmd in this build")


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def smol_with_eyes(test_model_path, tmp_path, capsys):
    """The test model imported with a synthetic projector, as ``smol``."""
    projector = write_mlp_projector(tmp_path / "mmproj-smol.gguf")
    assert main(["import", str(test_model_path), "--name", "smol", "--mmproj", str(projector)]) == 0
    capsys.readouterr()
    return "smol"


@pytest.fixture
def red(tmp_path):
    path = tmp_path / "red.png"
    path.write_bytes(png(40, 30, (255, 0, 0)))
    return path


@needs_mtmd
def test_ask_reads_the_attached_pictures_and_says_what_encoding_cost(smol_with_eyes, red,
                                                                     tmp_path, capsys):
    blue = tmp_path / "blue.png"
    blue.write_bytes(png(40, 30, (0, 0, 255)))
    code, out, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--image", str(red),
                             "--image", str(blue), "--temperature", "0", "--max-tokens", "8",
                             "--json", "What colours are these?")
    assert code == 0, err
    done = [json.loads(line) for line in out.splitlines()][-1]
    assert done["event"] == "done"
    assert done["timings"]["images_n"] == 2 and done["timings"]["image_ms"] > 0
    code, out, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--image", str(red),
                             "--temperature", "0", "--max-tokens", "4", "Colour?")
    assert code == 0 and "1 image encoded in" in err


@needs_mtmd
def test_an_animated_gif_is_read_by_its_first_frame_with_a_note(smol_with_eyes, tmp_path,
                                                                capsys):
    path = tmp_path / "blink.gif"
    path.write_bytes(gif(20, 20, [(255, 0, 0), (0, 0, 0)]))
    code, _, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--image", str(path),
                           "--max-tokens", "2", "hi")
    assert code == 0, err
    assert "blink.gif is an animated GIF (2 frames): only its first frame is read" in err


def test_a_model_without_a_projector_is_refused_before_it_loads(test_model_path, red, capsys,
                                                                 monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("a model was opened")

    monkeypatch.setattr("localchat.engine.factory.open_engine", no_load)
    code, out, err = run_cli(capsys, "ask", "--model", str(test_model_path), "--image", str(red),
                             "hi")
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "SmolLM2-135M-Instruct.Q4_1 does not read images; these do: " in line
    assert "gemma-3-4b" in line or "qwen2.5-vl" in line or "smolvlm" in line


@pytest.mark.parametrize("name, data, message", [
    ("notes.png", b"plain text\n", "notes.png is not an image localchat reads"),
    ("cut.png", png(40, 30)[:-30], "cut.png is a damaged or truncated PNG file"),
    ("huge.png", png(8, 8)[:16] + (9000).to_bytes(4, "big") + (9000).to_bytes(4, "big")
     + png(8, 8)[24:], "huge.png is 9000×9000 pixels (81.0 megapixels)"),
])
def test_a_bad_picture_is_one_line_exit_2_and_nothing_loads(tmp_path, capsys, monkeypatch,
                                                             name, data, message):
    monkeypatch.setattr("localchat.engine.factory.open_engine",
                        lambda *a, **k: pytest.fail("a model was opened"))
    path = tmp_path / name
    path.write_bytes(data)
    code, out, err = run_cli(capsys, "ask", "--image", str(path), "hi")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_a_missing_picture_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "ask", "--image", str(tmp_path / "nope.png"), "hi")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "does not exist" in err


@needs_mtmd
def test_a_session_keeps_the_pictures_of_its_questions(smol_with_eyes, red, capsys):
    from localchat.store import Store

    code, _, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--session", "s", "--image",
                           str(red), "--temperature", "0", "--max-tokens", "4", "Colour?")
    assert code == 0, err
    red.unlink()  # the session has its own copy
    code, _, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--session", "s",
                           "--temperature", "0", "--max-tokens", "4", "Sure?")
    assert code == 0, err
    with Store.open() as store:
        turns = store.turns(store.find_session("s").id)
        assert [t.images[0].name for t in turns if t.images] == ["red.png"]
        assert turns[-1].timings.images_n == 0  # the saved cache had the picture's cells


def test_a_model_whose_projector_file_is_gone_says_so_before_it_loads(smol_with_eyes, red,
                                                                      capsys, isolated_home):
    for projector in isolated_home.rglob("smol.mmproj.gguf"):
        projector.unlink()
    code, _, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--image", str(red), "hi")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "smol's image projector" in err and "is missing; import the model again" in err
