"""`localchat doctor` and the hardware probes behind it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import llama_cpp
import pytest

from localchat import paths
from localchat.cli import main
from localchat.engine.gpu import (
    BackendInfo,
    DeviceInfo,
    backend_info,
    detect_gpus,
    has_bundled_library,
    offload_problem,
    parse_nvidia_smi,
    parse_system_info,
)


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """Put an ``nvidia-smi`` on PATH that prints what the real one prints for our query."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def install(output: str, exit_code: int = 0) -> None:
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {exit_code}\n")
        script.chmod(0o755)

    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return install


def doctor_json(capsys) -> dict:
    assert main(["doctor", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_doctor_json_reports_build_paths_disk_and_models(capsys):
    report = doctor_json(capsys)

    llama = report["llama_cpp"]
    assert llama["version"] == llama_cpp.__version__
    assert "CPU" in llama["backends"] and llama["backend"]
    assert isinstance(llama["gpu_offload"], bool)
    assert llama["gpu_offload"] == (llama["offload_problem"] is None)
    assert isinstance(llama["cpu_features"], list)
    # Whether this build carries the image library: read from the package's lib/ folder.
    lib = Path(llama_cpp.__file__).parent / "lib"
    assert llama["multimodal"] == any(lib.glob("libmtmd.*"))
    assert {"name", "description", "kind", "total_mib", "free_mib"} <= set(llama["devices"][0])
    assert isinstance(report["gpus"], list)
    assert report["paths"]["config_file"] == str(paths.config_file())
    assert report["paths"]["models_dir"] == str(paths.models_dir())
    assert report["disk"]["models_dir_free_bytes"] > 0
    assert report["models"] == {"default": "smollm2-135m", "default_downloaded": False,
                                "downloaded": [], "partial": []}
    assert report["problems"] == []


def test_doctor_lists_downloaded_models(test_model_path, capsys):
    main(["import", str(test_model_path), "--name", "smol"])
    capsys.readouterr()

    downloaded = doctor_json(capsys)["models"]["downloaded"]

    assert [m["name"] for m in downloaded] == ["smol"]
    assert downloaded[0]["size_bytes"] == test_model_path.stat().st_size


def test_doctor_text_names_gpus_with_free_memory(fake_nvidia_smi, capsys):
    fake_nvidia_smi("NVIDIA GeForce RTX 4070 Laptop GPU, 8188, 7710\n")

    assert main(["doctor"]) == 0

    out = capsys.readouterr().out
    assert "NVIDIA GeForce RTX 4070 Laptop GPU: 7.5 GiB free of 8.0 GiB" in out
    assert "GPU offload" in out and "free disk" in out


def test_doctor_still_reports_when_the_config_is_broken(capsys):
    paths.config_file().write_text("default_model = \n")

    report = doctor_json(capsys)

    assert report["models"]["default"] is None
    assert report["problems"] and "invalid TOML" in report["problems"][0]


def test_gpus_are_parsed_from_nvidia_smi(fake_nvidia_smi):
    fake_nvidia_smi("NVIDIA H200, 143771, 143199\nNVIDIA A10G, 23028, 22000\n")

    assert [(g.name, g.total_mib, g.free_mib, g.index) for g in detect_gpus()] == [
        ("NVIDIA H200", 143771, 143199, 0), ("NVIDIA A10G", 23028, 22000, 1)]


def test_failing_nvidia_smi_means_no_gpus(fake_nvidia_smi):
    fake_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver\n",
                    exit_code=9)

    assert detect_gpus() == []


def test_no_nvidia_smi_means_no_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))

    assert detect_gpus() == []


def test_nvidia_smi_parsing_survives_odd_lines():
    output = ("Tesla V100, PCIe, 16384, 16000\n"  # a comma inside the name
              "Some GPU, [N/A], [N/A]\n"
              "\n"
              "garbage\n")

    gpus = parse_nvidia_smi(output)

    assert [(g.name, g.total_mib) for g in gpus] == [("Tesla V100, PCIe", 16384)]


def test_system_info_is_split_by_backend():
    info = parse_system_info("CUDA : ARCHS = 890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX2 = 1 | "
                             "AVX512 = 0 | ")

    assert info == {"CUDA": {"ARCHS": "890", "USE_GRAPHS": "1"},
                    "CPU": {"SSE3": "1", "AVX2": "1", "AVX512": "0"}}


def test_backend_info_describes_this_build():
    info = backend_info()

    assert info.llama_cpp_version == llama_cpp.__version__
    assert info.gpu_offload == bool(llama_cpp.llama_supports_gpu_offload())
    assert "CPU" in info.backends
    if not info.gpu_offload:
        assert info.backend == "CPU"
        assert "CMAKE_ARGS=" in info.offload_problem and "\n" not in info.offload_problem


def test_multimodal_support_is_read_from_the_bundled_libraries(tmp_path):
    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "lib" / "libllama.so").write_bytes(b"")
    fake = SimpleNamespace(__file__=str(package / "__init__.py"))
    assert not has_bundled_library(fake, "mtmd")
    (package / "lib" / "libmtmd.so.0").write_bytes(b"")
    assert has_bundled_library(fake, "mtmd")


def test_offload_problem_explains_each_case():
    cpu_only = BackendInfo(llama_cpp_version="0.3.36", gpu_offload=False, backend="CPU")
    assert "no GPU backend" in offload_problem(cpu_only)

    cuda_no_device = BackendInfo(llama_cpp_version="0.3.36", gpu_offload=True, backend="CUDA",
                                 devices=[DeviceInfo("CPU", "x86", "cpu", 1000, 900)])
    assert "sees no GPU" in offload_problem(cuda_no_device)

    cuda_ok = BackendInfo(llama_cpp_version="0.3.36", gpu_offload=True, backend="CUDA",
                          devices=[DeviceInfo("CUDA0", "RTX", "gpu", 8000, 7000)])
    assert offload_problem(cuda_ok) is None
