"""`localchat ask --image PATH` and the remote: ``--route remote`` sends the pictures to a remote
configured as reading them (``[remote] images = true``) and is refused in one line when it does
not; in mode auto a turn with pictures stays local unless the remote reads them, and a real
OpenAI-compatible server that fails on them (llama_cpp.server with a text-only model) falls back
to the local reply as any remote failure does."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from fault_server import FaultServer, reply
from image_fixture import bmp, gif, jpeg, png
from projector_fixture import write_mlp_projector
from remote_fixtures import llama_vision_server  # noqa: F401 - a fixture (llama_server: conftest)

from localchat.cli import main
from localchat.engine.vision import image_support

needs_mtmd = pytest.mark.skipif(not image_support().available, reason="no libmtmd in this build")
HARD = "Prove by induction that the colour count is n^2, and show your work step by step."


def configure(home: Path, base_url: str, *, images: bool | None = None) -> None:
    home.mkdir(parents=True, exist_ok=True)
    line = "" if images is None else f"images = {'true' if images else 'false'}\n"
    (home / "config.toml").write_text(f'[remote]\nmode = "auto"\nbase_url = "{base_url}"\n'
                                      f"timeout_s = 60\n{line}")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def red(tmp_path) -> Path:
    path = tmp_path / "red.png"
    path.write_bytes(png(40, 30, (255, 0, 0)))
    return path


@pytest.fixture
def smol_with_eyes(test_model_path, tmp_path, capsys) -> str:
    """The test model imported with a synthetic projector, as ``smol``."""
    projector = write_mlp_projector(tmp_path / "mmproj-smol.gguf")
    assert main(["import", str(test_model_path), "--name", "smol", "--mmproj", str(projector)]) == 0
    capsys.readouterr()
    return "smol"


@pytest.mark.model
def test_route_remote_sends_the_pictures_to_a_remote_that_reads_them(test_model_path, red,
                                                                     tmp_path, isolated_home,
                                                                     capsys):
    grey = tmp_path / "grey.jpg"
    grey.write_bytes(jpeg(16, 16))
    with FaultServer([reply("Red, then grey.")]) as server:
        configure(isolated_home, server.base_url, images=True)
        # The local model reads no pictures: with --route remote it never has to.
        code, out, err = run_cli(capsys, "ask", "-m", str(test_model_path), "--route", "remote",
                                 "--image", str(red), "--image", str(grey), "What colours?")
        [request] = server.requests
    assert code == 0, err
    assert out == "Red, then grey.\n"
    [message] = request.body["messages"]
    text, *pictures = message["content"]
    assert text == {"type": "text", "text": "What colours?"}
    assert [p["image_url"]["url"] for p in pictures] == [
        "data:image/png;base64," + base64.b64encode(red.read_bytes()).decode(),
        "data:image/jpeg;base64," + base64.b64encode(grey.read_bytes()).decode()]


@pytest.mark.model
def test_a_real_server_that_reads_pictures_reads_each_one_sent(
        test_model_path, red, tmp_path, isolated_home, llama_vision_server, capsys):  # noqa: F811
    others = []
    for name, data in [("grey.jpg", jpeg(16, 16)), ("red.gif", gif(8, 8)), ("red.bmp", bmp(8, 8))]:
        others.append(tmp_path / name)
        others[-1].write_bytes(data)
    configure(isolated_home, llama_vision_server.base_url, images=True)

    def pictures_read(*pictures: Path) -> int:
        before = llama_vision_server.pictures_encoded()
        code, out, err = run_cli(capsys, "ask", "-m", str(test_model_path), "--route", "remote",
                                 "--temperature", "0", "--max-tokens", "4", "--json",
                                 *[a for p in pictures for a in ("--image", str(p))], "Colour?")
        assert code == 0, err
        done = json.loads(out.splitlines()[-1])
        assert done["event"] == "done" and done["route"] == "remote"
        return llama_vision_server.pictures_encoded() - before

    # The server decodes each data URL (PNG, JPEG, GIF, BMP) and its projector encodes it.
    assert (pictures_read(), pictures_read(red), pictures_read(*others)) == (0, 1, 3)


@pytest.mark.parametrize("images", [None, False])
def test_route_remote_with_pictures_is_refused_in_one_line_when_the_remote_reads_none(
        red, isolated_home, capsys, monkeypatch, images):
    monkeypatch.setattr("localchat.engine.factory.open_engine",
                        lambda *a, **k: pytest.fail("a model was opened"))
    with FaultServer([reply("remote")]) as server:
        configure(isolated_home, server.base_url, images=images)
        code, out, err = run_cli(capsys, "ask", "--route", "remote", "--image", str(red), "hi")
        assert server.connections == 0
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "the remote model does not read pictures ([remote] images = false" in err
    assert "--image cannot be sent with --route remote" in err


@needs_mtmd
@pytest.mark.model
def test_in_mode_auto_a_question_with_a_picture_stays_local_with_a_notice(smol_with_eyes, red,
                                                                          isolated_home, capsys):
    with FaultServer([reply("remote")]) as server:
        configure(isolated_home, server.base_url)
        code, out, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--image", str(red),
                                 "--temperature", "0", "--max-tokens", "4", HARD)
        assert server.connections == 0
    assert code == 0, err
    assert out.strip()
    assert "the remote model does not read pictures ([remote] images = false in config.toml): " \
           "a message with pictures stays with the local model" in err
    assert "1 image encoded in" in err


@needs_mtmd
@pytest.mark.model
def test_a_real_server_failing_on_the_pictures_falls_back_to_the_local_reply(
        smol_with_eyes, red, isolated_home, llama_server, capsys):
    # llama_cpp.server with a text-only model cannot render image parts: it fails the request.
    configure(isolated_home, llama_server, images=True)
    code, out, err = run_cli(capsys, "ask", "--model", smol_with_eyes, "--image", str(red),
                             "--temperature", "0", "--max-tokens", "4", "--json", HARD)
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    kinds = [e["event"] for e in events]
    # The rules sent it away before any local token; the server's failure (its streaming
    # path dies rendering image parts: an empty body) hands it back.
    assert kinds.index("retract") < kinds.index("token")
    assert events[kinds.index("retract")]["reason"].endswith("answering locally")
    done = events[-1]
    assert done["event"] == "done" and done["route"] == "local" and done["timings"]["fell_back"]
    assert done["route_reason"].startswith("fallback: remote failed (the remote at 127.0.0.1:")
    assert done["timings"]["images_n"] == 1  # the local model read the picture after all
