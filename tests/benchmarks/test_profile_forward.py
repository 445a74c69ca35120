"""benchmarks/profile_forward.py end to end on a tiny target: both forwards are profiled and reported (speed is
measured by the script, never asserted)."""

import json

import pytest

from benchmarks import profile_forward

from helpers import save_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # as every evaluation test


def test_profile_forward_reports_the_baseline_step_and_each_tree_forward(tmp_path):
    target_dir = save_tiny_target("llama", tmp_path / "target")
    out = tmp_path / "profile.json"
    argv = ["--target", str(target_dir), "--past", "12", "--nodes", "2", "5", "--repeats", "2", "--top", "3"]
    assert profile_forward.main([*argv, "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    assert list(report["forwards"]) == ["generate", "tree-2", "tree-5"]
    for row in report["forwards"].values():
        assert row["wall_seconds"] > 0 and 1 <= len(row["host_ops"]) <= 3
        assert all(op["self_seconds"] >= 0 and op["calls"] >= 1 for op in row["host_ops"])
        assert "device_busy_share" not in row  # the CPU: no device
    # the tree forwards are the decoder's own: every linear and the attention ran, as in a step
    assert any("mm" in op["op"] or "linear" in op["op"] for op in report["forwards"]["tree-5"]["host_ops"])
    assert report["machine"]["device"] == "cpu" and report["past"] == 12
    table = out.with_suffix(".md").read_text()
    assert table.count("\n") == 2 + 3 and "| tree-5 |" in table


def test_profile_forward_refuses_sizes_below_one(tmp_path):
    with pytest.raises(SystemExit):
        profile_forward.main(["--target", "tiny", "--nodes", "0", "--out", str(tmp_path / "p.json")])
