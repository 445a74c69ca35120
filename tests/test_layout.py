"""The floors of src/specheads (docs/design.md, "Layout"), bottom up: core, heads, data, builders, decode,
then train and evaluate side by side, then methods, then cli. A floor imports only the floors below it:
never upward, never across (train and evaluate know nothing of each other), never in a loop, whether by an
import statement at module level, inside a function, or by name (importlib). Read from the sources.

A package's `__main__.py` is a program (`python -m specheads`, `python -m specheads.train`), not a module
any floor imports: it belongs to the cli floor wherever it stands.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specheads"
# bottom up; floors on one level may not import each other
LEVELS = [
    ("core",),
    ("heads",),
    ("data",),
    ("builders",),
    ("decode",),
    ("train", "evaluate"),
    ("methods",),
    ("cli",),
]
FLOORS = [f for level in LEVELS for f in level]
ROOT_MODULES = {"version"}  # the package's own root modules, open to every floor
# Imported inside functions, so that no command pays for them at start (`import specheads.cli` loads none
# of them) or so that an optional one is needed only where it is used.
LAZY = {"transformers", "accelerate", "deepspeed", "peft", "matplotlib", "gguf", "tokenizers", "fcntl", "PIL"}


def level(floor: str) -> int:
    return next(i for i, names in enumerate(LEVELS) if floor in names)


def sources(floor: str) -> list[Path]:
    return sorted((PACKAGE / floor).rglob("*.py"))


def floor_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return "cli" if path.name == "__main__.py" else rel.parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("specheads", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def specheads_imports(node: ast.AST) -> list[str]:
    """The specheads modules a statement imports: `import`, `from P import x` (P.x when that is a module),
    and `importlib.import_module("specheads...")` / `__import__("specheads...")` with a literal name."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [
            f"{node.module}.{a.name}" if is_module(f"{node.module}.{a.name}") else node.module
            for a in node.names
        ]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.Call) and node.args:
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        arg = node.args[0]
        if name in ("import_module", "__import__"):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return [arg.value]
            if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                return [str(arg.values[0].value) + "*"]  # f"specheads.cli.{name}": some module of cli
    return []


def all_sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def wrong_imports() -> list[str]:
    """Every import of a floor that is not below it, as 'file imports module'."""
    found = []
    for path in all_sources():
        rel = str(path.relative_to(PACKAGE))
        if path.parent == PACKAGE and path.name != "__main__.py":
            own = None  # a root module (version, __init__): it may import nothing of the floors
        else:
            own = floor_of(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in specheads_imports(node):
                parts = name.split(".")
                if parts[0] != "specheads" or len(parts) < 2 or parts[1] in ROOT_MODULES:
                    continue
                if own is None or parts[1] not in FLOORS:
                    found.append(f"{rel} imports {name}")
                elif parts[1] != own and level(parts[1]) >= level(own):
                    found.append(f"{rel} imports {name}")
    return found


def test_nothing_imports_upward_or_across():
    assert wrong_imports() == []


def test_every_package_is_a_floor():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages == set(FLOORS)


def module_graph() -> dict[str, set[str]]:
    """module -> the specheads modules its statements import, at module level or in a function."""
    graph: dict[str, set[str]] = {}
    for path in all_sources():
        edges = graph.setdefault(module_name(path), set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            edges.update(n for n in specheads_imports(node) if n.startswith("specheads.") and "*" not in n)
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


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between floors: a loop through floors is a loop even when no two modules close it."""
    floors: dict[str, set[str]] = {}
    for module, edges in graph.items():
        own = module.split(".")[1] if len(module.split(".")) > 2 else module
        floors.setdefault(own, set()).update(
            e.split(".")[1] for e in edges if len(e.split(".")) > 2 and e.split(".")[1] != own
        )
    return floors


def test_no_import_circle():
    graph = module_graph()
    assert len(graph) > 80 and "specheads.data.distillation" in graph["specheads.cli.distill"]
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_scan_sees_imports_by_name():
    code = 'import importlib\nimportlib.import_module("specheads.methods")\n__import__(f"specheads.cli.{x}")'
    names = [n for node in ast.walk(ast.parse(code)) for n in specheads_imports(node)]
    assert names == ["importlib", "specheads.methods", "specheads.cli.*"]


def test_imports_inside_functions_are_the_lazy_ones_with_their_reason():
    wrong = []
    for path in all_sources():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                # a comment on the statement's lines or the line above it
                reason = any("#" in line for line in lines[node.lineno - 2 : node.end_lineno])
                if name.split(".")[0] not in LAZY | {"specheads"} or not reason:
                    wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert wrong == []


@pytest.mark.parametrize("floor", ["core", "heads", "decode"])
def test_the_scan_sees_imports(floor):
    graph = module_graph()
    assert any(module.startswith(f"specheads.{floor}.") and edges for module, edges in graph.items())
    assert "specheads.core.target" in graph["specheads.decode.step"]


def test_the_distribution_installs_the_package_alone():
    """pyproject installs src/specheads (every package of it) and the shipped recipes as specheads/recipes,
    nothing else: tests, scripts, docs and benchmarks stay beside the package."""
    from setuptools.config.pyprojecttoml import load_file  # its own TOML reader on any Python

    setup = load_file(ROOT / "pyproject.toml")["tool"]["setuptools"]
    assert setup["package-dir"] == {"": "src", "specheads.recipes": "recipes"}
    packages = {
        ".".join(p.relative_to(ROOT / "src").parts)
        for p in PACKAGE.rglob("*")
        if p.is_dir() and (p / "__init__.py").is_file()
    }
    assert set(setup["packages"]) == {"specheads", *packages} | {"specheads.recipes"}
    assert not any(
        name.split(".")[1:2] in (["tests"], ["scripts"], ["benchmarks"]) for name in setup["packages"]
    )
