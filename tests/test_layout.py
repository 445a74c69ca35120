"""The floors (../shared/DESIGN.md, Layout): decode/ and train/ stand on heads/ side by side, evaluate/
stands on decode/ and heads/; nothing imports upward. Read from the sources, imports inside functions too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what each package may import of specheads (besides itself); `version` is the root's own module
ALLOWED = {
    "decode": {"heads"},
    "train": {"heads", "version"},
    "evaluate": {"heads", "decode", "version"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    """specheads.<x> imported anywhere in the package's files -> the files that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "specheads" and len(parts) > 1 and parts[1] != package:
                    found.setdefault(parts[1], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_nothing_imports_upward(package):
    upward = {
        name: files for name, files in imported_packages(package).items() if name not in ALLOWED[package]
    }
    assert not upward, f"{package}/ imports {upward}"


def test_the_scan_sees_imports():
    assert "heads" in imported_packages("decode") and "decode" in imported_packages("evaluate")
