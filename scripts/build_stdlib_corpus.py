"""Write the pinned corpus of the embedded default target: the Python standard library's source, tests and
installed packages left out, as a deterministic tar.xz (sorted names, zero times and owners).

The archive shipped in data/ was made with CPython 3.11.7's standard library:

    python3.11 scripts/build_stdlib_corpus.py --out src/specheads/data/stdlib-corpus-cpython-3.11.7.tar.xz

and src/specheads/data/stdlib_corpus.py pins its sha256. Another Python writes another archive: that is the point of
pinning one, since a corpus read from the running Python changes with its version.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import sysconfig
import tarfile
from pathlib import Path

# Folders never read: tests (the stdlib ships a large test suite), installed packages, caches.
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
LICENSE = "LICENSE.txt"  # the PSF license, shipped with the sources it covers


def source_files(root: Path) -> list[str]:
    """Relative paths of the standard library's .py files, sorted; tests and site-packages left out."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith("test_") for part in rel.parts):
            continue
        if not rel.name.endswith("_test.py"):
            files.append(rel.as_posix())
    return sorted(files)


def write_archive(root: Path, out: Path) -> str:
    """Write the archive; returns its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.USTAR_FORMAT, preset=9) as tar:
        for name in [LICENSE, *source_files(root)]:
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(data))
    out.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    args = p.parse_args(argv)
    if args.out.exists():
        sys.exit(f"{args.out} exists; remove it first")
    sha = write_archive(args.root, args.out)
    print(json.dumps({"out": str(args.out), "python": sys.version.split()[0], "sha256": sha}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
