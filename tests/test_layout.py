"""The floors (../shared/DESIGN.md, Layout, and README "Layout"): decode/ and train/ stand on heads/ side by
side, evaluate/ stands on decode/ and heads/, methods/ and commands/ on all of them; nothing imports
upward. No module-level import circle. Imports inside functions only of the slow or optional packages that
would otherwise load at every command's start, each with its reason on the line. Read from the sources."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("heads", "train", "decode", "evaluate", "methods", "commands")
# what each package may import of specheads (besides itself); `version` is the root's own module
ALLOWED = {
    "heads": {"version"},
    "decode": {"heads"},
    "train": {"heads", "version"},
    "evaluate": {"heads", "decode", "version"},
    "methods": {"heads", "train", "decode", "evaluate"},
    "commands": {"heads", "train", "decode", "evaluate", "methods", "version"},
}
# The one import across a floor: the named-target resolver (heads/) builds the tiny target and SmolLM2 with
# train/builders/ when a name is first resolved (the method table loads methods/ by name the same way,
# with importlib, not an import statement).
# `python -m specheads.train` (the form `accelerate launch -m` runs) is the console script's `train`.
# kv_cache.py reaches kv_buffer.py (whose cache layer subclasses transformers') only when a cache is made or
# compacted, so importing the decoder still costs no transformers.
ACROSS = {
    ("heads/named_targets.py", "specheads.train.builders"),
    ("train/__main__.py", "specheads.cli"),
    ("decode/kv_cache.py", "specheads.decode.kv_buffer"),
}
# Imported inside functions, so that no command pays for them at start (`import specheads.commands` loads
# none of them) or so that an optional one is needed only where it is used.
LAZY = {"transformers", "accelerate", "deepspeed", "peft", "matplotlib", "gguf", "tokenizers", "fcntl", "PIL"}


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("specheads", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def specheads_imports(node: ast.AST) -> list[str]:
    """The specheads modules an import statement names (`from P import x`: P.x when that is a module)."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{a.name}" for a in node.names]
        return [
            n
            if (ROOT / Path(*n.split(".")[1:])).with_suffix(".py").is_file()
            or (ROOT / Path(*n.split(".")[1:]) / "__init__.py").is_file()
            else node.module
            for n in names
        ]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def imported_packages(package: str) -> dict[str, set[str]]:
    """specheads.<x> imported anywhere in the package's files -> the files that import it."""
    found: dict[str, set[str]] = {}
    for path in sources(package):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in specheads_imports(node):
                parts = name.split(".")
                if parts[0] != "specheads" or len(parts) < 2 or parts[1] == package:
                    continue
                if any(rel == f and name.startswith(m) for f, m in ACROSS):
                    continue
                found.setdefault(parts[1], set()).add(rel)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_nothing_imports_upward(package):
    upward = {
        name: files for name, files in imported_packages(package).items() if name not in ALLOWED[package]
    }
    assert not upward, f"{package}/ imports {upward}"


def module_graph() -> dict[str, set[str]]:
    """module -> the specheads modules its module-level statements import (what runs at import time)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sources(package):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            edges = graph.setdefault(module_name(path), set())
            for stmt in tree.body:
                for node in ast.walk(stmt):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                        break
                    edges.update(n for n in specheads_imports(node) if n.startswith("specheads."))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_circle():
    graph = module_graph()
    assert len(graph) > 80 and "specheads.train.data.distillation" in graph["specheads.commands.distill"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_imports_inside_functions_are_the_lazy_ones_with_their_reason():
    wrong = []
    for package in PACKAGES:
        for path in sources(package):
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            for fn in ast.walk(ast.parse(text)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if not isinstance(node, (ast.Import, ast.ImportFrom)):
                        continue
                    name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    rel = str(path.relative_to(ROOT))
                    if any(rel == f and name.startswith(m) for f, m in ACROSS):
                        continue
                    # a comment on the statement's lines or the line above it
                    reason = any("#" in line for line in lines[node.lineno - 2 : node.end_lineno])
                    if name.split(".")[0] not in LAZY or not reason:
                        wrong.append(f"{rel}:{node.lineno} {name}")
    assert wrong == []


def test_the_scan_sees_imports():
    assert "heads" in imported_packages("decode") and "decode" in imported_packages("evaluate")
