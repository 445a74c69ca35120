"""scripts/bench_decode.py runs end to end on a tiny target with fresh heads (a smoke test: speed is
measured by the script, never asserted)."""

import json

from scripts import bench_decode
from specheads.core.target import FrozenTarget
from specheads.heads import MedusaConfig, MedusaHeads, save_heads

from helpers import save_tiny_target


def test_bench_decode_writes_its_report(tmp_path):
    target_dir = save_tiny_target("llama", tmp_path / "target")
    target = FrozenTarget.from_pretrained(str(target_dir))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=3))
    save_heads(heads.init_lm_heads_from(target.lm_head), tmp_path / "heads", target.record())
    (tmp_path / "prompts.txt").write_text('def add(a, b):\n{"prompt": "import os\\nimport sys\\n"}\n')

    out = tmp_path / "bench_decode.json"
    args = [
        "--target",
        str(target_dir),
        "--heads",
        str(tmp_path / "heads"),
        "--prompts",
        str(tmp_path / "prompts.txt"),
    ]
    assert bench_decode.main([*args, "--max-new-tokens", "12", "--tree", "medusa-15", "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    assert report["prompts"] == 2 and report["identical_to_baseline"] == "2 of 2"
    assert report["mean_accept_length"] >= 1.0 and report["new_tokens"] == 24
    assert set(report["seconds"]) == {
        "prefill",
        "draft",
        "tree_inputs",
        "tree_forward",
        "verify",
        "compact",
        "overhead",
    }
    assert report["tree"] == {"name": "medusa-15", "nodes": 16, "depth": 3}
