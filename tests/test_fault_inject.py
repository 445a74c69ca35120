"""scripts/fault_inject.py, CI-sized: one kill of each long command (`cache`, whose shards resume, and at
--small sizes `tiny-target`, `distill`, `train` with `export`), each checked against an uninterrupted run;
and the checks it makes catch what they are for."""

import json

import pytest

from scripts import fault_inject

from helpers import save_tiny_target

pytestmark = pytest.mark.slow  # CI's second stage: whole kill-and-resume chains


def test_a_killed_cache_resumes_to_the_same_bytes(tmp_path):
    target = save_tiny_target("llama", tmp_path / "target")
    report_path = tmp_path / "report.json"
    argv = ["--commands", "cache", "--kills", "1", "--seed", "0", "--rows", "128", "--target", str(target)]
    rc = fault_inject.main([*argv, "--work", str(tmp_path / "work"), "--out", str(report_path)])
    report = json.loads(report_path.read_text())
    cache = report["commands"]["cache"]
    assert rc == 0 and report["all_identical"], cache["problems"]
    assert cache["kills"] == 1 and cache["resumes"] == 1 and cache["identical"]
    kill = cache["kill_points"][0]  # landed while the cache was being written
    first, last = cache["writes_s"]
    assert 0 <= kill["after_first_write_s"] <= max(last - first, 0.01)
    assert "train/index.json" in cache["compared"] and "train/shard-00000.safetensors" in cache["compared"]


@pytest.mark.parametrize(
    "commands",
    [("tiny-target",), ("distill",), ("train", "export")],
    ids=["tiny-target", "distill", "train-export"],
)
def test_a_killed_command_ends_as_an_uninterrupted_one(tmp_path, commands):
    """One kill of each command at the suite's sizes (--small); train and export together, as export's
    heads are train's reference run's."""
    target = save_tiny_target("llama", tmp_path / "target")
    report_path = tmp_path / "report.json"
    argv = ["--commands", *commands, "--kills", "1", "--seed", "0", "--rows", "128", "--small"]
    argv += ["--target", str(target), "--work", str(tmp_path / "work"), "--out", str(report_path)]
    rc = fault_inject.main(argv)
    report = json.loads(report_path.read_text())
    for name in commands:
        done = report["commands"][name]
        assert done["identical"] and not done["problems"], done["problems"]
        assert done["kills"] == 1 and done["compared"], done
    assert rc == 0 and report["all_identical"]


def test_the_checks_see_leftovers_and_differences(tmp_path):
    fi = fault_inject
    out = tmp_path / "chain" / "out"
    (out / "checkpoints" / ".tmp-step-5").mkdir(parents=True)
    (out / "checkpoints" / "step-0").mkdir()
    (out / ".specheads.lock").write_text("{}")
    (out / "model.safetensors").write_bytes(b"a")
    (out.parent / ".out.tmp-123-x").mkdir()
    assert fi.leftovers(out) == [".out.tmp-123-x", "out/.specheads.lock", "out/checkpoints/.tmp-step-5"]
    cache = fi.COMMAND_TABLE["cache"]
    before = fi.digests(cache, out)
    (out / "model.safetensors").write_bytes(b"b")
    assert fi.digests(cache, out) != before
