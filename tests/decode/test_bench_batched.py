"""scripts/bench_batched.py runs end to end on a tiny random target with fresh heads (a smoke test: speed
is measured by the script, never asserted)."""

import json

import pytest
import torch

from scripts import bench_batched
from specheads.core.target import FrozenTarget
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, layer_config_from, save_heads

from helpers import save_tiny_target


def fresh_heads(method: str, target: FrozenTarget):
    torch.manual_seed(0)
    if method == "medusa":
        heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=3))
        return heads.init_lm_heads_from(target.lm_head)
    return EagleHead(EagleConfig(layer_config_from(target.config)))


@pytest.mark.parametrize("method, tree", [("medusa", "medusa-15"), ("eagle", "dynamic-8")])
def test_bench_batched_writes_its_report(tmp_path, method, tree):
    target_dir = save_tiny_target("llama", tmp_path / "target")
    target = FrozenTarget.from_pretrained(str(target_dir))
    save_heads(fresh_heads(method, target), tmp_path / "heads", target.record())
    questions = ["def add(a, b):", "import os", "Write a haiku about the sea, please, in five lines."]
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question_id": i, "turns": [q]}) + "\n" for i, q in enumerate(questions))
    )

    out = tmp_path / "bench_batched.json"
    args = [
        "--target",
        str(target_dir),
        "--heads",
        str(tmp_path / "heads"),
        "--prompts",
        str(tmp_path / "q.jsonl"),
    ]
    args += ["--max-new-tokens", "10", "--batch-sizes", "1", "2", "--tree", tree, "--out", str(out)]
    assert bench_batched.main(args) == 0

    report = json.loads(out.read_text())
    assert report["method"] == method and report["tree"]["name"] == tree
    assert report["prompts"]["count"] == 3 and len(set(report["prompt_tokens"])) == 3  # ragged prompts
    one, two = report["by_batch_size"]
    assert (one["batch_size"], one["groups"], two["batch_size"], two["groups"]) == (1, 3, 2, 2)
    for row in (one, two):
        assert row["identical_to_baseline"] == "3 of 3"
        assert row["new_tokens"] == row["baseline_new_tokens"] > 3
        assert row["mean_accept_length"] >= 1.0 and row["tokens_per_second"] > 0 and row["steps"] > 0
        assert set(row["phase_seconds"]) == {
            "prefill",
            "draft",
            "tree_inputs",
            "tree_forward",
            "verify",
            "compact",
            "overhead",
        }
    assert one["scaling"] == 1.0 and two["steps"] < one["steps"]  # rows share steps in a batch
