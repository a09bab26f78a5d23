"""What hardware llama.cpp can use here: the build's backends, CPU features, GPUs and free VRAM.

Everything is cheap (no model is loaded): ``nvidia-smi`` for NVIDIA GPUs, and llama.cpp's own
backend registry (through ctypes on the ``libggml`` that llama-cpp-python ships) for the backends
compiled in and the devices they see, which also covers Metal and Vulkan.
"""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NVIDIA_SMI_QUERY = ["--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"]

# ggml backend registry names -> the names users know. Backends that are not a GPU are listed
# separately: they never make offload possible.
_BACKEND_NAMES = {"MTL": "Metal", "Metal": "Metal", "CUDA": "CUDA", "ROCm": "ROCm", "HIP": "ROCm",
                  "Vulkan": "Vulkan", "SYCL": "SYCL", "MUSA": "MUSA", "CANN": "CANN",
                  "OpenCL": "OpenCL"}
_NOT_GPU = {"CPU", "BLAS", "RPC", "AMX"}
_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}

_REINSTALL = ('reinstall with CMAKE_ARGS="{flag}" pip install --force-reinstall --no-cache-dir '
              "llama-cpp-python")


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as the driver tool reports it."""

    name: str
    total_mib: int
    free_mib: int
    index: int = 0


@dataclass(frozen=True)
class DeviceInfo:
    """A device llama.cpp's backends registered (the CPU is one too)."""

    name: str
    description: str
    kind: str  # "cpu", "gpu", "igpu", "accel"
    total_mib: int
    free_mib: int


@dataclass
class BackendInfo:
    """The llama.cpp build in use; ``offload_problem`` is one line, None when GPU offload works."""

    llama_cpp_version: str | None
    gpu_offload: bool
    backend: str  # "CUDA", "Metal", "Vulkan", ... or "CPU"
    backends: list[str] = field(default_factory=list)  # every registered ggml backend
    cpu_features: list[str] = field(default_factory=list)  # e.g. ["AVX2", "FMA", "F16C"]
    features: dict[str, dict[str, str]] = field(default_factory=dict)  # per backend, as printed
    devices: list[DeviceInfo] = field(default_factory=list)
    offload_problem: str | None = None
    # Whether llama-cpp-python's image library (mtmd) is on disk; whether it loads is
    # engine/vision.py's question (asked only when images are wanted).
    multimodal: bool = False


def detect_gpus(timeout: float = 5.0) -> list[GpuInfo]:
    """NVIDIA GPUs with total and free memory (MiB); empty when nvidia-smi is absent or fails."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return []
    try:
        result = subprocess.run([executable, *NVIDIA_SMI_QUERY], capture_output=True, text=True,
                                timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    return parse_nvidia_smi(result.stdout)


def parse_nvidia_smi(output: str) -> list[GpuInfo]:
    """Parse ``name, total, free`` CSV lines; lines with unreadable numbers ("[N/A]") are skipped.

    The name is everything before the last two fields, so a name containing a comma survives.
    """
    gpus: list[GpuInfo] = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            total, free = int(float(parts[-2])), int(float(parts[-1]))
        except ValueError:
            continue
        gpus.append(GpuInfo(name=", ".join(parts[:-2]), total_mib=total, free_mib=free,
                            index=len(gpus)))
    return gpus


def backend_info() -> BackendInfo:
    """Describe the installed llama-cpp-python build without loading a model."""
    try:
        import llama_cpp
    except ImportError as exc:
        return BackendInfo(llama_cpp_version=None, gpu_offload=False, backend="unavailable",
                           offload_problem=f"llama-cpp-python cannot be imported ({exc})")
    features = parse_system_info(llama_cpp.llama_print_system_info().decode("utf-8", "replace"))
    registry, devices = _ggml_registry()
    backends = registry or list(features)
    gpu_backends = [_BACKEND_NAMES.get(name, name) for name in backends if name not in _NOT_GPU]
    info = BackendInfo(
        llama_cpp_version=getattr(llama_cpp, "__version__", None),
        gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
        backend=gpu_backends[0] if gpu_backends else "CPU",
        backends=backends,
        cpu_features=[name for name, value in features.get("CPU", {}).items() if value == "1"],
        features=features,
        devices=devices,
        multimodal=has_bundled_library(llama_cpp, "mtmd"),
    )
    info.offload_problem = offload_problem(info)
    return info


def has_bundled_library(package: Any, name: str) -> bool:
    """Whether llama-cpp-python's ``lib/`` folder holds ``lib{name}`` (checked on disk, never
    loaded: engine/vision.py loads mtmd only when images are wanted)."""
    folder = Path(package.__file__).parent / "lib"
    return any(folder.glob(f"lib{name}.*")) or any(folder.glob(f"{name}.dll"))


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """Parse ``llama_print_system_info()``: "CPU : SSE3 = 1 | AVX = 1 | CUDA : ARCHS = 890 | "."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for item in text.split("|"):
        item = item.strip()
        if " : " in item:
            name, item = (part.strip() for part in item.split(" : ", 1))
            current = sections.setdefault(name, {})
        if current is not None and "=" in item:
            key, value = (part.strip() for part in item.split("=", 1))
            current[key] = value
    return sections


def offload_problem(info: BackendInfo) -> str | None:
    """Why layers cannot go to a GPU with this build, as one line with the fix; None if they can."""
    if info.llama_cpp_version is None:
        return info.offload_problem
    if not info.gpu_offload or info.backend == "CPU":
        flag, note = _suggested_flag()
        return ("this llama-cpp-python build has no GPU backend (CPU only); "
                + _REINSTALL.format(flag=flag) + note)
    if info.devices and not any(d.kind in ("gpu", "igpu") for d in info.devices):
        return (f"the {info.backend} backend is built in but sees no GPU "
                "(is the driver installed and the GPU visible to this process?)")
    return None


def _suggested_flag() -> tuple[str, str]:
    """The CMake flag for the GPU this machine most likely has, and a note when it is a guess."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "-DGGML_METAL=on", ""
    if shutil.which("nvidia-smi"):
        return "-DGGML_CUDA=on", ""
    if shutil.which("vulkaninfo"):
        return "-DGGML_VULKAN=on", ""
    return "-DGGML_CUDA=on", " (for AMD/Intel GPUs use -DGGML_VULKAN=on)"


def _ggml_registry() -> tuple[list[str], list[DeviceInfo]]:
    """Backends and devices from ggml's registry; empty lists if the library lacks the calls."""
    try:
        from llama_cpp._ggml import libggml as lib

        lib.ggml_backend_reg_count.restype = ctypes.c_size_t
        lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_reg_get.restype = ctypes.c_void_p
        lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_name.restype = ctypes.c_char_p
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]
    except (ImportError, AttributeError, OSError):
        return [], []
    registry = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
                for i in range(lib.ggml_backend_reg_count())]
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        devices.append(DeviceInfo(
            name=lib.ggml_backend_dev_name(device).decode(),
            description=(lib.ggml_backend_dev_description(device) or b"").decode(),
            kind=_DEVICE_KINDS.get(lib.ggml_backend_dev_type(device), "other"),
            total_mib=total.value >> 20,
            free_mib=free.value >> 20,
        ))
    return registry, devices
