"""The import layers: every arrow between localchat's packages points down the order below.

The imports are read with ``ast`` from the source (nothing is imported), so a lazy import inside a
function counts as much as one at the top of a module: it is a real dependency at run time, only
a later one. An import under ``if TYPE_CHECKING:`` counts too: it never runs, but a part that
types its host as the whole app and reaches its siblings through it is in a circle with it all
the same (they hid five circles while they were skipped). An exception needs a written reason in
``ALLOWED``.

A package is a folder under ``localchat/``; the top-level modules (``errors.py``, ``paths.py``,
...) and the ``settings`` package together form the base layer. A package may import its own
modules and anything in a layer below it, never one above; the base layer's modules may import
each other. No modules anywhere import each other in a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "localchat"

# Bottom first. Each layer with the reason it sits where it does.
LAYERS: list[tuple[str, set[str], str]] = [
    ("base", {"__init__", "errors", "paths", "events", "reasoning", "names", "terminal", "atomic", "ending",
              "logs", "percentiles", "attachments", "user_files", "settings", "formats", "reply"},
     "words every layer shares: the user's errors, where files live, the event vocabulary, "
     "safe names and terminal output, the settings' schema with each value's type, default "
     "and range (the engine, the context and the remote read their settings, never the reverse), "
     "the answer formats (``formats/``: a JSON Schema or a tool call as a grammar, the "
     "constraint a turn samples under, the check of an answer and of a call's arguments), and "
     "reading a model's reply text (``reply/``: reasoning, the call and result types, one "
     "table of model families, lenient JSON; the engine renders calls, tools/ runs them): "
     "plain logic the engine, the remote and the front ends share"),
    ("models", {"models"},
     "the model files on disk: the registry, the GGUF reader, pull; knows no engine"),
    ("engine", {"engine"},
     "owns the llama.cpp context: load, prefill, decode, KV cache; reads model files"),
    ("context", {"context"},
     "the context as data: the conversation the model sees, the token budget, trims and "
     "summaries, over an engine"),
    ("remote", {"remote"},
     "an OpenAI-compatible model a turn may be handed to: it takes the context's messages and "
     "emits the engine's events"),
    ("store", {"store"},
     "SQLite: stored conversations and their numbers; nothing below reads the database"),
    ("tools", {"tools"},
     "MCP servers and built-in tools, and the approval policy: they know nothing of the model, "
     "the context or the app (the words they share are the base layer's reply.calls)"),
    ("chat", {"chat"},
     "one stored conversation wired together: context, engine, remote escalation and store"),
    ("tui", {"tui"}, "the Textual app over the chat layer"),
    ("serve", {"serve"},
     "the OpenAI and Ollama APIs over the engine: a front end like the app and ``ask``"),
    ("bench", {"bench"}, "measurements, some of them driving the app itself"),
    ("commands", {"commands"}, "the CLI's subcommands, one module each (``bench`` among them)"),
    ("cli", {"cli", "__main__"}, "argument parsing: the entry point over everything"),
]

# (importer, imported) -> why an arrow against the order is allowed. Empty is the goal.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _exists(module: str) -> bool:
    path = ROOT.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(path: Path, text: str | None = None) -> Iterator[tuple[str, int]]:
    """(module imported, line) for each import in ``path`` (whose source is ``text`` when given),
    type-only ones included."""
    module = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8") if text is None else text, str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")
                if path.name != "__init__.py":
                    package.pop()
                base = ".".join(package[: len(package) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            submodules = [f"{source}.{a.name}" for a in node.names if _exists(f"{source}.{a.name}")]
            # ``from localchat import paths`` depends on the module; on the package too where its
            # __init__ is more than a face (it runs first, and ``formats/__init__`` imports
            # ``formats.validate``: a module of it importing ``from localchat.formats import x`` is
            # in a circle with it).
            if submodules and _defines_something(source):
                submodules.append(source)
            yield from ((name, node.lineno) for name in submodules or [source])


def _defines_something(package: str) -> bool:
    """Whether the package's __init__ defines a function or a class (not only re-exports)."""
    init = ROOT.parent.joinpath(*package.split("."), "__init__.py")
    if not init.exists():
        return False
    tree = ast.parse(init.read_text(encoding="utf-8"))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)


def package_of(module: str) -> str:
    """``localchat.engine.kv`` -> "engine"; ``localchat.paths`` -> "paths"; ``localchat`` -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


LAYER_OF = {package: index for index, (_, packages, _) in enumerate(LAYERS) for package in packages}


def arrows() -> list[tuple[str, str, str]]:
    """(importer, imported, "file:line") for every import from one localchat module of another."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        importer = _module_name(path)
        for imported, line in imports(path):
            if imported == "localchat" or imported.startswith("localchat."):
                found.append((importer, imported, f"{path.relative_to(ROOT.parent)}:{line}"))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_layer():
    packages = {package_of(_module_name(path)) for path in ROOT.rglob("*.py")}
    assert packages - LAYER_OF.keys() == set(), "add the new package to LAYERS, with its reason"


def test_no_cycle_between_packages():
    """The base layer counts as one package here; cycles inside it are the next test's."""
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in arrows():
        a, b = (_package_or_base(module) for module in (importer, imported))
        if a != b:
            graph.setdefault(a, set()).add(b)
    assert _cycles(graph) == []


def _package_or_base(module: str) -> str:
    package = package_of(module)
    return "base" if LAYER_OF.get(package) == 0 else package


def test_no_cycle_between_modules():
    """Between any two modules, the base layer's included (``names`` and ``terminal`` once
    imported each other, and so did ``models.download`` and ``models.pypi_source``)."""
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in arrows():
        if importer != imported:
            graph.setdefault(importer, set()).add(imported)
    assert _cycles(graph) == []


def test_every_arrow_points_down_the_layers():
    against = []
    for importer, imported, where in arrows():
        a, b = package_of(importer), package_of(imported)
        if a != b and LAYER_OF[a] < LAYER_OF[b] and (importer, imported) not in ALLOWED:
            against.append(f"{where}: {importer} ({LAYERS[LAYER_OF[a]][0]}) imports "
                           f"{imported} ({LAYERS[LAYER_OF[b]][0]})")
    assert against == []


@pytest.mark.parametrize("source, expected", [
    ("from localchat import paths\n", ["localchat.paths"]),
    ("from localchat.engine.kv import KvRecord\n", ["localchat.engine.kv"]),
    ("import localchat.store.store\n", ["localchat.store.store"]),
    ("def f():\n    from localchat.tui import app\n", ["localchat.tui.app"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from localchat.tui.app import A\n",
     ["localchat.tui.app"]),
    ("from .budget import TurnSpan\n", ["localchat.context.budget"]),
])
def test_imports_are_read_with_lazy_and_type_only_ones(source, expected):
    path = ROOT / "context" / "probe.py"  # not read: its source is given
    assert [name for name, _ in imports(path, source) if name.startswith("localchat")] == expected


def test_no_module_is_over_600_lines():
    """A module says one thing: past 600 lines it has become a room of its own."""
    sizes = {str(path.relative_to(ROOT.parent)): len(path.read_text(encoding="utf-8").splitlines())
             for path in ROOT.rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > 600} == {}
