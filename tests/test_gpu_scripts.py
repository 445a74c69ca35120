"""scripts/gpu/*.sh run only on a lent GPU machine (README "On a GPU"); here they must at least parse, so
that a session with a GPU does not spend its device minutes on a syntax error."""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts" / "gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_gpu_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_gpu_stage_is_there():
    assert {s.name for s in SCRIPTS} == {"env.sh", "prepare.sh", "setup.sh", "tiny.sh", "smollm2.sh", "smollm2-table.sh"}
