"""``localchat doctor``: what this machine and install can do, and why a model might be slow.

It never fails on a broken config or registry: that is reported as a finding, because doctor is
what a user runs when something is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from dataclasses import asdict
from typing import Any

from localchat import __version__, paths
from localchat.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser(
        "doctor", help="check llama.cpp, GPU, paths and models",
        description="Report the llama.cpp build (version, backend, CPU features, GPU offload and "
                    "why not), GPUs and free VRAM, where localchat keeps files, free disk and "
                    "downloaded models.")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of text")
    doctor.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    report = collect_report()
    print(json.dumps(report, indent=2) if args.json else render_report(report))
    return 0


def collect_report() -> dict[str, Any]:
    """Everything doctor knows, as JSON-able data (the shape ``doctor --json`` prints)."""
    from localchat.engine.gpu import backend_info, detect_gpus
    from localchat.engine.vision import image_support

    backend = backend_info()
    images = image_support() if backend.llama_cpp_version is not None else None
    cpu = next((d for d in backend.devices if d.kind == "cpu"), None)
    return {
        "localchat": {"version": __version__, "python": platform.python_version(),
                      "platform": f"{platform.system()} {platform.machine()}"},
        "llama_cpp": {
            "version": backend.llama_cpp_version,
            "backend": backend.backend,
            "backends": backend.backends,
            "gpu_offload": backend.gpu_offload and backend.offload_problem is None,
            "offload_problem": backend.offload_problem,
            "cpu": cpu.description if cpu else platform.processor(),
            "cpu_threads": os.cpu_count(),
            "cpu_features": backend.cpu_features,
            "devices": [asdict(d) for d in backend.devices],
            "multimodal": backend.multimodal,  # libmtmd is in llama_cpp/lib (on disk)
        },
        "images": {"available": bool(images and images.available),
                   "reason": images.reason if images else "llama-cpp-python cannot be imported"},
        "gpus": [asdict(gpu) for gpu in detect_gpus()],
        **_paths_section(),
        "hub": {
            "endpoint": os.environ.get("HF_ENDPOINT") or "https://huggingface.co",
            "offline": os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"},
            "token_set": bool(os.environ.get("HF_TOKEN")),
        },
        **_models_section(),
    }


def _paths_section() -> dict[str, Any]:
    """Where files live, and free disk. A folder that cannot be created (a read-only home) is a
    problem to report, not a crash: doctor is what a user runs when something is wrong."""
    where: dict[str, Any] = {"localchat_home": os.environ.get("LOCALCHAT_HOME")}
    problems: list[str] = []
    for key, locate in (("config_file", paths.config_file),
                        ("user_registry_file", paths.user_registry_file),
                        ("data_dir", paths.data_dir), ("models_dir", paths.models_dir),
                        ("cache_dir", paths.cache_dir), ("log_file", paths.log_file)):
        try:
            where[key] = str(locate())
        except UserError as exc:
            where[key] = None
            if str(exc) not in problems:
                problems.append(str(exc))
    try:
        free = shutil.disk_usage(where["models_dir"]).free if where["models_dir"] else None
    except OSError:
        free = None
    return {"paths": where, "disk": {"models_dir_free_bytes": free}, "path_problems": problems}


def _models_section() -> dict[str, Any]:
    from localchat.models.download import part_files
    from localchat.models.registry import is_downloaded, known_models, local_path
    from localchat.settings import load_config

    problems = []
    try:
        default = load_config().default_model
    except UserError as exc:
        problems.append(str(exc))
        default = None
    try:
        specs = known_models()
    except UserError as exc:
        problems.append(str(exc))
        specs = []
    try:
        downloaded = [
            {"name": spec.name, "path": str(local_path(spec)),
             "size_bytes": local_path(spec).stat().st_size, "memory": _memory_kind(local_path(spec))}
            for spec in specs if is_downloaded(spec)
        ]
        partial = [{"name": spec.name, "path": str(part), "size_bytes": part.stat().st_size}
                   for spec in specs for part in part_files(local_path(spec))]
    except UserError:  # the models folder cannot be created: reported with the paths
        downloaded, partial = [], []
    return {
        "models": {
            "default": default,
            "default_downloaded": any(m["name"] == default for m in downloaded),
            "downloaded": downloaded,
            "partial": partial,  # pulls that were cut off: `pull` resumes them, `rm` deletes them
        },
        "problems": problems,
    }


def _memory_kind(path) -> str | None:
    """kv | swa | recurrent | hybrid (None if the header cannot be read)."""
    from localchat.models.gguf import GGUFError, read_gguf

    try:
        return read_gguf(path).memory_kind
    except (GGUFError, OSError):
        return None


def render_report(report: dict[str, Any]) -> str:
    from localchat.models.progress import format_bytes

    llama, models = report["llama_cpp"], report["models"]
    lines = [("localchat", f"{report['localchat']['version']} (Python "
                           f"{report['localchat']['python']}, {report['localchat']['platform']})")]
    if llama["version"] is None:
        lines.append(("llama.cpp", f"not usable: {llama['offload_problem']}"))
    else:
        built_in = ", ".join(llama["backends"])
        lines.append(("llama.cpp", f"llama-cpp-python {llama['version']}, backend "
                                   f"{llama['backend']} (built in: {built_in})"))
        images = report["images"]
        lines.append(("images", f"available ({images['reason']})" if images["available"]
                      else f"unavailable: {images['reason']}"))
    lines.append(("CPU", f"{llama['cpu']}, {llama['cpu_threads']} threads"))
    lines.append(("CPU features", " ".join(llama["cpu_features"]) or "none reported"))
    lines.append(("GPU offload", "yes" if llama["gpu_offload"]
                  else f"no: {llama['offload_problem']}"))
    gpus = report["gpus"] or [d for d in llama["devices"] if d["kind"] in ("gpu", "igpu")]
    if gpus:
        for gpu in gpus:
            lines.append(("GPU", f"{gpu['name']}: {gpu['free_mib'] / 1024:.1f} GiB free of "
                                 f"{gpu['total_mib'] / 1024:.1f} GiB"))
    else:
        lines.append(("GPU", "none found (no nvidia-smi, and no GPU device in llama.cpp)"))
    for key, label in (("config_file", "config"), ("user_registry_file", "your models"),
                       ("data_dir", "data"), ("models_dir", "models dir"), ("cache_dir", "cache"),
                       ("log_file", "log")):
        lines.append((label, report["paths"][key] or "not usable (see PROBLEM)"))
    free = report["disk"]["models_dir_free_bytes"]
    lines.append(("free disk", format_bytes(free) if free is not None else "unknown"))
    hub = report["hub"]
    lines.append(("Hub", f"{hub['endpoint']}{' (HF_HUB_OFFLINE set)' if hub['offline'] else ''}"
                         f"{', HF_TOKEN set' if hub['token_set'] else ''}"))
    for model in models["downloaded"]:
        memory = f", {model['memory']} memory" if model.get("memory") else ""
        lines.append(("downloaded", f"{model['name']} ({format_bytes(model['size_bytes'])}{memory})"))
    if not models["downloaded"]:
        lines.append(("downloaded", "no models yet"))
    for part in models["partial"]:
        lines.append(("partial", f"{part['name']} ({format_bytes(part['size_bytes'])} so far: "
                                 f"`localchat pull {part['name']}` resumes it, `localchat rm "
                                 f"{part['name']}` deletes it)"))
    if models["default"]:
        state = ("downloaded" if models["default_downloaded"]
                 else f"not downloaded: run `localchat pull {models['default']}`")
        lines.append(("default model", f"{models['default']} ({state})"))
    for problem in report.get("path_problems", []) + report["problems"]:
        lines.append(("PROBLEM", problem))
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in lines)


if __name__ == "__main__":  # pragma: no cover - handy when the CLI itself is broken
    sys.exit(run_doctor(argparse.Namespace(json="--json" in sys.argv)))
