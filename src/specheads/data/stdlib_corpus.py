"""The embedded default's corpus: the Python standard library's own source, pinned.

The corpus is CPython 3.11.7's standard library (tests and site-packages left out), shipped beside this
file as a tar.xz whose sha256 is pinned below (`scripts/build_stdlib_corpus.py` wrote it). Reading the
running Python's own library instead made the tiny target, its held-out prompts and every figure built
on them change with the Python version; the pinned archive is the same bytes on every machine.
A fixed, hash-chosen slice of the files is held out for evaluation.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tarfile
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

ARCHIVE = Path(__file__).with_name("stdlib-corpus-cpython-3.11.7.tar.xz")
ARCHIVE_SHA256 = "12e6d5bac1e8cd52d3364a138e76ac21a6cc128360ad0c04b560f6d61bd20208"
NAME = "cpython-3.11.7-stdlib"


@dataclass(frozen=True)
class Corpus:
    """Source files by path. `key` names the content (caches built from it are keyed by it)."""

    key: str
    texts: dict[str, str]  # relative path -> source text; .py files only, sorted by path

    @property
    def files(self) -> list[str]:
        return list(self.texts)


@functools.cache
def stdlib_corpus() -> Corpus:
    """The pinned standard-library corpus, read from the archive shipped with specheads (~0.1 s)."""
    try:
        data = ARCHIVE.read_bytes()
    except OSError as e:
        raise FileNotFoundError(
            f"the tiny target's corpus {ARCHIVE} is missing: reinstall specheads ({e})"
        ) from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != ARCHIVE_SHA256:
        raise ValueError(f"{ARCHIVE} has sha256 {digest}, expected {ARCHIVE_SHA256}: the file is damaged")
    texts = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".py"):
                raw = tar.extractfile(member).read()
                texts[member.name] = raw.decode("utf-8", errors="replace")
    return Corpus(key=f"{NAME}-{digest[:16]}", texts=dict(sorted(texts.items())))


def is_heldout(relpath: str, fraction: float) -> bool:
    """Held out by a hash of the path alone, so the split is the same for every seed and budget."""
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def split_files(files: list[str], fraction: float) -> tuple[list[str], list[str]]:
    train = [f for f in files if not is_heldout(f, fraction)]
    heldout = [f for f in files if is_heldout(f, fraction)]
    if not heldout or not train:
        raise ValueError(f"held-out fraction {fraction} leaves an empty split of {len(files)} files")
    return train, heldout


def function_chats(source: str, per_file: int) -> list[list[dict[str, str]]]:
    """Chat turns made from documented functions: the user gives the signature and docstring, the
    assistant writes the function. Gives the tiny target's chat template real use in training.
    """
    try:
        with warnings.catch_warnings():  # newer Pythons warn of 3.11 sources' invalid escapes
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    chats = []
    for node in ast.walk(tree):
        if len(chats) >= per_file:
            break
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(getattr(doc, "value", None), ast.Constant)):
            continue
        if not isinstance(doc.value.value, str) or node.decorator_list:
            continue
        header = textwrap.dedent("\n".join(lines[node.lineno - 1 : doc.end_lineno]))
        body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
        chats.append(
            [
                {"role": "user", "content": f"Write this Python function:\n{header}"},
                {"role": "assistant", "content": body},
            ]
        )
    return chats
