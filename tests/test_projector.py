"""Image projectors (mmproj): the registry field, `pull` and `rm` of both files, `import --mmproj`
with its width check, and which models `models` says read images."""

from __future__ import annotations

import json
import tomllib

import pytest
from hub_server import make_gguf
from projector_fixture import write_mlp_projector
from test_pull import hub  # noqa: F401  (the fake Hub fixture)

from localchat import paths
from localchat.cli import main
from localchat.errors import ConfigError
from localchat.models.download import part_files
from localchat.models.gguf import read_gguf
from localchat.models.projector import projector_width
from localchat.models.registry import load_registry, local_path, projector_spec, resolve_model

REPO = "acme/Tiny-VL-GGUF"
MODEL_FILE = "tiny-vl-Q4_K_M.gguf"
PROJ_FILE = "mmproj-tiny-vl-f16.gguf"
VISION = {"qwen2.5-vl-3b", "qwen2.5-vl-7b", "smolvlm-256m", "smolvlm-500m", "mistral-small-3.1",
          "gemma3-4b", "gemma3-12b"}


def error_line(err: str) -> str:
    line = err.strip().splitlines()[-1]
    assert line.startswith("localchat: error: ")
    return line


def write_user_registry(text: str) -> None:
    paths.user_registry_file().parent.mkdir(parents=True, exist_ok=True)
    paths.user_registry_file().write_text(text)


@pytest.fixture
def projector(tmp_path):
    return write_mlp_projector(tmp_path / "mmproj-smol.gguf")


@pytest.fixture
def tiny_vl(hub, tmp_path):  # noqa: F811
    """A model and its projector on the fake Hub, named by a user registry entry."""
    hub.add_file(REPO, MODEL_FILE, make_gguf(embedding=576))
    hub.add_file(REPO, PROJ_FILE, write_mlp_projector(tmp_path / PROJ_FILE).read_bytes())
    write_user_registry(f'[models.tiny-vl]\nrepo = "{REPO}"\nfilename = "{MODEL_FILE}"\n'
                        f'mmproj = {{ filename = "{PROJ_FILE}" }}\n')
    return hub


# --- the projector's width ------------------------------------------------------------------------

def test_an_mlp_projectors_width_is_the_rows_of_its_last_layer(projector):
    assert projector_width(read_gguf(projector)) == 576


def test_a_projector_without_its_last_layer_falls_back_to_projection_dim(tmp_path):
    import gguf

    path = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("clip.projector_type", "unknown-kind")
    writer.add_uint32("clip.vision.projection_dim", 2048)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert projector_width(read_gguf(path)) == 2048


# --- the registry -------------------------------------------------------------------------------

def test_the_catalogues_vision_models_name_their_projectors():
    registry = load_registry()
    reading = {name for name, spec in registry.items() if spec.reads_images}
    assert reading == VISION
    for name in VISION:
        projector = projector_spec(registry[name])
        assert projector is not None and projector.is_hub, name
        assert projector.filename.startswith("mmproj-") and projector.sha256 is None, name
    assert projector_spec(registry["gemma3-4b"]).repo == "ggml-org/gemma-3-4b-it-GGUF"
    assert projector_spec(registry["qwen2.5-vl-3b"]).repo == "ggml-org/Qwen2.5-VL-3B-Instruct-GGUF"
    assert projector_spec(registry["smollm2-135m"]) is None


@pytest.mark.parametrize(("table", "message"), [
    ('{ filname = "p.gguf" }', r"models\.a\.mmproj\.filname: unknown field"),
    ('{ repo = "x/y" }', r"models\.a\.mmproj: needs filename"),
    ('{ filename = "p.gguf", size_bytes = -1 }', r"mmproj\.size_bytes: must not be negative"),
    ('{ filename = "p.gguf", sha256 = "abc" }', r"mmproj\.sha256: must be 64 lowercase hex"),
    ('{ filename = "../p.gguf" }', r"models\.a\.mmproj\.filename: "),
    ('"p.gguf"', r"models\.a\.mmproj: must be a table"),
])
def test_a_bad_mmproj_is_one_line_naming_the_field(table, message):
    write_user_registry(f'[models.a]\nrepo = "x/y"\nfilename = "a.gguf"\nmmproj = {table}\n')
    with pytest.raises(ConfigError, match=message):
        load_registry()


# --- pull, rm, models ------------------------------------------------------------------------------

def test_pull_fetches_the_model_then_its_projector_and_rm_deletes_both(tiny_vl, capsys):
    assert main(["pull", "tiny-vl"]) == 0

    spec = resolve_model("tiny-vl")
    model, proj = local_path(spec), local_path(projector_spec(spec))
    assert proj == model.with_name(PROJ_FILE)  # the model's repository, unless it names one
    assert model.read_bytes() == tiny_vl.files[REPO, MODEL_FILE]
    assert proj.read_bytes() == tiny_vl.files[REPO, PROJ_FILE]
    out = capsys.readouterr().out
    assert "pulled tiny-vl:" in out and "pulled tiny-vl's projector:" in out

    assert main(["rm", "tiny-vl"]) == 0
    assert "deleted tiny-vl and its projector" in capsys.readouterr().out
    assert not model.exists() and not proj.exists()


def test_a_pull_whose_projector_fails_keeps_the_model_and_fetches_the_projector_next_time(
        tiny_vl, capsys):
    content = tiny_vl.files.pop((REPO, PROJ_FILE))

    assert main(["pull", "tiny-vl"]) == 1
    assert f"{PROJ_FILE}" in error_line(capsys.readouterr().err)
    spec = resolve_model("tiny-vl")
    proj = local_path(projector_spec(spec))
    assert local_path(spec).is_file() and not proj.exists()
    assert main(["models", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "tiny-vl")
    assert row["images"] and row["downloaded"] and not row["mmproj_downloaded"]

    tiny_vl.files[REPO, PROJ_FILE] = content
    assert main(["pull", "tiny-vl"]) == 0
    out = capsys.readouterr().out
    assert "tiny-vl is already downloaded" in out and "pulled tiny-vl's projector" in out
    assert proj.read_bytes() == content and not part_files(proj)


def test_models_says_which_models_read_images(capsys):
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["qwen2.5-vl-3b"]["images"] and not rows["smollm2-135m"]["images"]
    assert rows["qwen2.5-vl-3b"]["mmproj_path"].endswith("mmproj-Qwen2.5-VL-3B-Instruct-f16.gguf")

    assert main(["models"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "IMAGES" in table[0]
    [smolvlm] = [line for line in table if line.startswith("smolvlm-256m ")]
    assert " yes " in smolvlm


# --- import --mmproj ------------------------------------------------------------------------------

def test_import_with_a_fitting_projector_copies_both(test_model_path, projector, capsys):
    assert main(["import", str(test_model_path), "--name", "smol", "--mmproj", str(projector)]) == 0

    assert "imported smol with its image projector smol.mmproj.gguf" in capsys.readouterr().out
    entry = tomllib.loads(paths.user_registry_file().read_text())["models"]["smol"]
    assert entry["mmproj"] == {"path": "imported/smol.mmproj.gguf",
                               "size_bytes": projector.stat().st_size}
    spec = resolve_model("smol")
    copied = local_path(projector_spec(spec))
    assert spec.reads_images and copied.read_bytes() == projector.read_bytes()
    capsys.readouterr()

    assert main(["rm", "smol"]) == 0
    assert not copied.exists() and projector.exists()  # the user's own file stays
    assert "smol" not in load_registry()


def test_import_refuses_a_projector_of_another_width_in_one_line(test_model_path, tmp_path, capsys):
    other = write_mlp_projector(tmp_path / "mmproj-other.gguf", width=2048)

    assert main(["import", str(test_model_path), "--name", "smol", "--mmproj", str(other)]) == 1

    line = error_line(capsys.readouterr().err)
    assert "mmproj-other.gguf writes 2048-wide embeddings" in line
    assert "reads 576-wide ones" in line
    assert "smol" not in load_registry()
    imported = paths.models_dir() / "imported"
    assert not imported.exists() or not list(imported.iterdir())


def test_import_refuses_a_model_given_as_the_projector(test_model_path, capsys):
    assert main(["import", str(test_model_path), "--name", "smol",
                 "--mmproj", str(test_model_path)]) == 1
    assert "is not an image projector" in error_line(capsys.readouterr().err)


def test_a_pulled_projector_is_not_listed_as_a_model_of_its_own(tiny_vl, capsys):
    main(["pull", "tiny-vl"])
    capsys.readouterr()

    assert main(["models", "--json"]) == 0
    names = [row["name"] for row in json.loads(capsys.readouterr().out)]
    assert "tiny-vl" in names and not any(PROJ_FILE in name for name in names)


def _images_available() -> bool:
    from localchat.engine.vision import image_support

    return image_support().available


@pytest.mark.skipif(not _images_available(), reason="this llama-cpp-python has no libmtmd")
def test_llama_cpp_agrees_with_the_width_check(test_model_path, tmp_path):
    """libmtmd loads the synthetic projector beside the test model, and refuses one of another
    width: the check import makes is the one llama.cpp makes at load time."""
    import llama_cpp
    from llama_cpp import mtmd_cpp

    llm = llama_cpp.Llama(str(test_model_path), n_ctx=256, verbose=False)
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 1, False
    for width, loads in ((576, True), (2048, False)):
        path = write_mlp_projector(tmp_path / f"mmproj-{width}.gguf", width=width)
        ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), llm.model, params)
        assert bool(ctx) == loads, width
        if ctx:
            assert mtmd_cpp.mtmd_support_vision(ctx)
            mtmd_cpp.mtmd_free(ctx)
    llm.close()
