"""scripts/bench_efficiency.py end to end on a tiny target with fresh Medusa and EAGLE heads: its figures
hang together (speed is measured by the script, never asserted)."""

import json

import pytest
import torch

from scripts import bench_efficiency
from specheads.core.target import FrozenTarget
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, layer_config_from, save_heads
from specheads.methods import methods

from helpers import save_tiny_target

QUESTIONS = [
    {"question_id": 1, "category": "coding", "turns": ["def add(a, b):"]},
    {"question_id": 2, "category": "coding", "turns": ["import os\nimport sys\n"]},
]


def test_bench_efficiency_reports_the_ideal_and_the_measured_speedup(tmp_path):
    target_dir = save_tiny_target("llama", tmp_path / "target")
    target = FrozenTarget.from_pretrained(str(target_dir))
    medusa = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    save_heads(medusa.init_lm_heads_from(target.lm_head), tmp_path / "medusa", target.record())
    counts = torch.arange(target.vocab_size)  # EAGLE decodes over the 20 last ids (--draft-vocab 0 20)
    eagle = EagleHead(EagleConfig(layer_config_from(target.config)))
    save_heads(eagle, tmp_path / "eagle", target.record(), label_counts=counts)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))

    out = tmp_path / "eff.json"
    argv = ["--target", str(target_dir), "--heads", str(tmp_path / "medusa"), str(tmp_path / "eagle")]
    argv += ["--tree", "medusa-15", "dynamic-8", "--prompts", str(questions), "--max-new-tokens", "10"]
    argv += ["--draft-vocab", "0", "20"]
    assert bench_efficiency.main([*argv, "--sizes", "1", "4", "--repeats", "2", "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    assert [r["method"] for r in report["heads"]] == ["medusa", "eagle"]
    for row in report["heads"]:
        nodes = str(row["tree"]["nodes"])
        assert set(row["forward_cost_seconds"]) >= {"1", "4", nodes}
        costs = row["forward_cost_seconds"]
        assert row["ideal_speedup"] == pytest.approx(row["tau"] * costs["1"] / costs[nodes])
        assert row["efficiency"] == pytest.approx(row["measured_speedup"] / row["ideal_speedup"])
        assert row["identical_to_generate"] == "2/2" and row["tau"] >= 1.0
        assert sum(row["phase_fraction"].values()) == pytest.approx(1.0, abs=1e-6)
        assert row["outside_forward_fraction"] == pytest.approx(1 - row["phase_fraction"]["tree_forward"])
    # one run: every head is set against the same generate() runs and the same t(N) curve, swept
    # --repeats times after each prompt, over every tree's size
    medusa_row, eagle_row = report["heads"]
    assert medusa_row["forward_cost_seconds"] == eagle_row["forward_cost_seconds"]
    trees = {str(r["tree"]["nodes"]) for r in report["heads"]}
    assert set(medusa_row["forward_cost_seconds"]) == {"1", "4", *trees} and len(trees) == 2
    assert medusa_row["forward_cost_sweeps"] == 2 * len(QUESTIONS)
    assert medusa_row["generate_tokens_per_second"] == eagle_row["generate_tokens_per_second"]
    assert out.with_suffix(".md").read_text().count("\n") == 4  # header, rule, one row a head
    assert medusa_row["tree"]["draft_vocab"] is None and eagle_row["tree"]["draft_vocab"] == 20
    assert "| eagle (draft vocabulary 20) |" in out.with_suffix(".md").read_text()


def test_bench_efficiency_decodes_heads_in_the_targets_dtype(tmp_path):
    """Medusa heads sharing the target's lm_head, timed in bf16 (as on a GPU): the heads are cast to the
    target's dtype as `eval` and `compare` cast them (they once met a bf16 projection in fp32 and failed)."""
    target_dir = save_tiny_target("llama", tmp_path / "target")
    target = FrozenTarget.from_pretrained(str(target_dir))
    medusa = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2, share_lm_head=True))
    save_heads(medusa, tmp_path / "medusa", target.record())
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps(QUESTIONS[0]) + "\n")

    out = tmp_path / "eff.json"
    argv = ["--target", str(target_dir), "--heads", str(tmp_path / "medusa"), "--tree", "medusa-15"]
    argv += ["--prompts", str(questions), "--max-new-tokens", "6", "--sizes", "1", "--repeats", "1"]
    assert bench_efficiency.main([*argv, "--dtype", "bfloat16", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["heads"][0]["tau"] >= 1.0


def test_cost_curve_times_the_tree_forward_alone(tmp_path, monkeypatch):
    """t(N) is the forward the decoder's tree_forward phase times: the chain's mask and positions (the
    tree-inputs phase) are built before the clock starts. Made 0.3 s slow, they must not show in t(N)."""
    import time

    target_dir = save_tiny_target("llama", tmp_path / "target")
    target = FrozenTarget.from_pretrained(str(target_dir))
    medusa = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    save_heads(medusa.init_lm_heads_from(target.lm_head), tmp_path / "medusa", target.record())

    from specheads.decode import SpeculativeDecoder
    from specheads.decode.drafter_factory import drafter_for

    heads, config = bench_efficiency.load_heads(tmp_path / "medusa", target=target, methods=methods())
    drafter, _ = drafter_for(heads, config, target, "medusa-15", methods=methods())
    inputs = bench_efficiency.batched_tree_inputs

    def slow_inputs(*args, **kwargs):
        time.sleep(0.3)
        return inputs(*args, **kwargs)

    monkeypatch.setattr(bench_efficiency, "batched_tree_inputs", slow_inputs)
    curve = bench_efficiency.CostCurve(SpeculativeDecoder(target, drafter), past=12, sizes=[1, 8])
    curve.sweep(0)
    assert all(len(s) == 1 and s[0] < 0.3 for s in curve.samples.values())
