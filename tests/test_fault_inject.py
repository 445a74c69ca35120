"""scripts/fault_inject.py, CI-sized: one kill of `specheads cache` (its shards resume), checked against an
uninterrupted run; and the checks it makes catch what they are for."""

import json

from scripts import fault_inject

from helpers import save_tiny_target


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
