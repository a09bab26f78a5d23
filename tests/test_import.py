"""`localchat import` and `rm`: a real GGUF becomes a named model; broken files are refused."""

from __future__ import annotations

import json
import tomllib

import pytest

from localchat import paths
from localchat.cli import main
from localchat.models.registry import load_registry, local_path, require_local, resolve_model


def error_line(err: str) -> str:
    [line] = err.strip().splitlines()
    assert line.startswith("localchat: error: ")
    return line


def test_import_of_the_real_model_adds_a_named_entry(test_model_path, capsys):
    assert main(["import", str(test_model_path), "--name", "smol"]) == 0

    assert "imported smol" in capsys.readouterr().out
    spec = resolve_model("smol")
    path = require_local(spec)
    assert path.parent == paths.models_dir() / "imported"
    assert path.stat().st_size == test_model_path.stat().st_size
    entry = tomllib.loads(paths.user_registry_file().read_text())["models"]["smol"]
    assert entry["path"] == "imported/smol.gguf"  # relative: survives moving LOCALCHAT_HOME
    assert (entry["context_length"], entry["n_ctx"], entry["quant"]) == (8192, 4096, "Q4_1")


def test_imported_model_is_listed_as_downloaded(test_model_path, capsys):
    main(["import", str(test_model_path), "--name", "smol"])
    capsys.readouterr()

    assert main(["models", "--json"]) == 0

    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["smol"]["downloaded"] and rows["smol"]["origin"] == "user"


def test_default_name_comes_from_the_file_name(test_model_path, capsys):
    assert main(["import", str(test_model_path)]) == 0

    assert "smollm2-135m-instruct.q4_1" in load_registry()


def test_import_keeps_the_users_comments_and_entries(test_model_path):
    registry_file = paths.user_registry_file()
    registry_file.write_text('# my models\n[models."qwen2.5-7b"]\nn_ctx = 16384\n')

    main(["import", str(test_model_path), "--name", "smol"])

    text = registry_file.read_text()
    assert text.startswith('# my models\n[models."qwen2.5-7b"]\nn_ctx = 16384\n')
    assert load_registry()["qwen2.5-7b"].n_ctx == 16384


def test_truncated_copy_is_refused(test_model_path, tmp_path, capsys):
    cut = tmp_path / "cut.gguf"
    with test_model_path.open("rb") as f:
        cut.write_bytes(f.read(5_000_000))  # header intact, tensor data cut short

    assert main(["import", str(cut)]) == 1

    assert "is truncated" in error_line(capsys.readouterr().err)
    assert "cut" not in load_registry()
    assert not (paths.models_dir() / "imported").exists() or not any(
        (paths.models_dir() / "imported").iterdir())


def test_non_gguf_file_is_refused(tmp_path, capsys):
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model " * 10)

    assert main(["import", str(notes)]) == 1
    assert "is not a GGUF model file" in error_line(capsys.readouterr().err)


def test_name_already_in_the_registry_is_refused(test_model_path, capsys):
    assert main(["import", str(test_model_path), "--name", "smollm2-135m"]) == 1
    assert "already exists" in error_line(capsys.readouterr().err)


def test_rm_deletes_the_imported_copy_and_its_entry_but_not_the_original(test_model_path, capsys):
    main(["import", str(test_model_path), "--name", "smol"])
    copy = local_path(resolve_model("smol"))

    assert main(["rm", "smol"]) == 0

    assert not copy.exists()
    assert "smol" not in load_registry()
    assert test_model_path.is_file()
    assert "removed it from your models.toml" in capsys.readouterr().out


def test_rm_refuses_to_delete_a_file_outside_the_models_folder(test_model_path, capsys):
    assert main(["rm", str(test_model_path)]) == 1

    assert "outside localchat's models folder" in error_line(capsys.readouterr().err)
    assert test_model_path.is_file()


@pytest.mark.parametrize("name", ["two words", "a/b", "hf:x"])
def test_unusable_names_are_refused(test_model_path, name, capsys):
    assert main(["import", str(test_model_path), "--name", name]) == 1
    assert "not a usable model name" in error_line(capsys.readouterr().err)


def test_import_copies_the_file_in_the_kernel_or_else_in_blocks_never_linking_it(tmp_path, monkeypatch):
    import errno

    from hub_server import make_gguf

    from localchat.models import file_copy

    source = tmp_path / "small.gguf"
    source.write_bytes(make_gguf())
    assert main(["import", str(source), "--name", "kernel"]) == 0  # copy_file_range (no reflink here)

    def no_kernel_copy(*args: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(file_copy.os, "copy_file_range", no_kernel_copy)
    monkeypatch.setattr(file_copy, "_BLOCK", 4096)  # several blocks
    assert main(["import", str(source), "--name", "blocks"]) == 0
    for name in ("kernel", "blocks"):
        copy = local_path(resolve_model(name))
        assert copy.read_bytes() == source.read_bytes()
        assert copy.stat().st_ino != source.stat().st_ino and copy.stat().st_nlink == 1
    assert sorted(p.name for p in copy.parent.iterdir()) == ["blocks.gguf", "kernel.gguf"]
