"""The scripts run both ways the READMEs give: `python -m benchmarks.NAME` from the repository root, and
`python benchmarks/NAME.py` from any folder (a script that imports its siblings finds them either way)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict:
    src = str(ROOT / "src")  # the package under test, as the suite's own process imports it
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_a_script_run_by_path_from_elsewhere_finds_its_siblings(tmp_path):
    script = "benchmarks/bench_trainers.py"  # it imports its bench_trainers_* siblings
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), "--help"],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]


def test_a_script_runs_as_a_module_from_the_root():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_host_memory", "--help"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "--steps" in proc.stdout, proc.stderr[-2000:]


def test_no_test_loads_a_script_by_its_file_path():
    """Tests import what they need (`from scripts import bench_decode`, `from benchmarks import ...`): a
    module loaded from its file path is a second copy, which a test's monkeypatch of the imported one misses.
    (tests/consumers/trainer_run.py runs the peers' own trainers with runpy: their code, not ours.)"""
    loaders = ("spec_from_file_location", "SourceFileLoader", "run_path(", "machinery.SourceFileLoader")
    found = [
        f"{path.relative_to(ROOT)}: {word}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path != Path(__file__).resolve()
        for word in loaders
        if word in path.read_text()
    ]
    assert not found, found
