"""Held-out evaluations after the first read the target's states kept from it (train/held_out.py): the same
metrics as a forward each time, with no decoder layer run, before and after the heads train further; for
EAGLE-3 only the draft vocabulary's columns of the lm_head."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks import bench_held_out, bench_teacher_columns
from specheads.methods import method_named, methods
from specheads.train import loop, prepare
from specheads.train.distributed import make_accelerator
from specheads.train.held_out import HeldOutStates
from specheads.train.recipe import load_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


def set_up(method: str, text_data: Path, tmp_path: Path, **overrides):
    cfg = load_config(
        REPO / "recipes" / "tiny" / f"{method}.yaml",
        {
            "data": [str(text_data)],
            "output_dir": str(tmp_path / "run"),
            "max_steps": 4,
            "batch_size": 4,
            "max_length": 48,
            "eval_batches": 3,  # of the recipe's held-out files
            "report_to": "none",
            **overrides,
        },
        methods=methods(),
    )
    accelerator = make_accelerator(cfg)
    return cfg, accelerator, loop.set_up(cfg, method_named(cfg.method), accelerator)


def same_metrics(a: dict, b: dict) -> bool:
    """The same metrics, to float rounding (floats to a relative 1e-6, as benchmarks/bench_held_out.py compares
    them): a kept EAGLE-3 batch's teacher columns come from a product over fewer rows of the lm_head, the same
    to the last bit on the CPUs measured, not promised elsewhere. A count or accuracy that moved by one token
    moves by far more than this."""
    return bench_held_out.close_records(a, b)


class LayerCalls:
    """How many times a module (the target's first decoder layer by default) ran."""

    def __init__(self, target, module=None):
        self.count = 0
        self.handle = (module or target.layers[0]).register_forward_hook(self.seen)

    def seen(self, *_):
        self.count += 1

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_kept_states_give_a_forwards_metrics_without_running_the_decoder(method, text_data, tmp_path):
    cfg, accelerator, run = set_up(method, text_data, tmp_path)
    assert isinstance(run.held_out, HeldOutStates)
    calls = LayerCalls(run.target)

    def evaluate(states):
        return loop.evaluate(cfg, run.method, accelerator, run.model, run.target, run.eval_loader, states)

    heads = LayerCalls(run.target, run.target.lm_head)
    plain = evaluate(None)
    assert calls.take() == 3
    lm_heads = heads.take()  # one a batch in the target's forward (and EAGLE-1's loss reads it too)
    first = evaluate(run.held_out)
    assert calls.take() == 3  # the first evaluation runs the target, and keeps its states
    assert sorted(run.held_out.kept) == [0, 1, 2] and heads.take() == lm_heads
    second = evaluate(run.held_out)
    assert calls.take() == 0
    # EAGLE-3's loss reads the argmax (kept) and the draft vocabulary's columns (from their rows alone)
    assert heads.take() == lm_heads - (3 if method == "eagle3" else 0)
    assert plain == first and same_metrics(first, second) and plain["tokens"] > 0
    if method != "eagle3":
        assert first == second

    # the heads train on; the kept states are still the target's
    batches = prepare.train_batches(cfg, run.train_rows, run.collate, accelerator, start=0)
    window = loop.metric_sums(cfg, run.method, accelerator.device)
    timing = {"target": loop.TargetClock("cpu"), "step": 0.0, "labels": 0}
    for step in (1, 2):
        loop.train_step(cfg, accelerator, run, batches, window, timing, step)
    calls.take()
    kept = evaluate(run.held_out)
    assert calls.take() == 0
    assert same_metrics(kept, evaluate(None)) and not same_metrics(kept, plain)


def test_the_cap_keeps_the_batches_that_fit_and_zero_keeps_none(text_data, tmp_path):
    cfg, accelerator, run = set_up("eagle3", text_data, tmp_path)
    calls = LayerCalls(run.target)
    loop.evaluate(cfg, run.method, accelerator, run.model, run.target, run.eval_loader, run.held_out)
    sizes = [
        sum(t.numel() * t.element_size() for t in [*kept.hidden.values(), kept.top_tokens])
        for kept in run.held_out.kept.values()
    ]
    assert run.held_out.bytes == sum(sizes) > 0
    # the eagle3 loss reads three captured layers, the final norm's output (for the draft vocabulary's
    # logits) and the target's top tokens
    for kept in run.held_out.kept.values():
        assert len(kept.hidden) == 4 and kept.top_tokens.shape == kept.input_ids.shape

    capped = HeldOutStates(1, run.held_out.columns)
    capped.limit = sizes[0] + sizes[1] - 1  # room for the first batch only
    plain = loop.evaluate(cfg, run.method, accelerator, run.model, run.target, run.eval_loader, None)
    calls.take()
    first = loop.evaluate(cfg, run.method, accelerator, run.model, run.target, run.eval_loader, capped)
    assert sorted(capped.kept) == [0] and capped.full and calls.take() == 3
    second = loop.evaluate(cfg, run.method, accelerator, run.model, run.target, run.eval_loader, capped)
    assert calls.take() == 2 and plain == first and same_metrics(first, second)

    _, _, off = set_up("eagle3", text_data, tmp_path / "off", eval_cache_mib=0)
    loop.evaluate(cfg, off.method, accelerator, off.model, off.target, off.eval_loader, off.held_out)
    assert off.held_out.kept == {}


def test_a_kept_batch_is_used_only_for_the_same_rows(text_data, tmp_path):
    cfg, accelerator, run = set_up("medusa", text_data, tmp_path)
    batch = next(iter(run.eval_loader))
    objective = run.model
    out = run.held_out.target_output(
        run.target, batch, capture=objective.capture_layers, logits=True, index=0
    )
    calls = LayerCalls(run.target)
    other = {k: v.flip(0) for k, v in batch.items()}  # the same batch index, other rows
    flipped = run.held_out.target_output(
        run.target, other, capture=objective.capture_layers, logits=True, index=0
    )
    assert calls.take() == 1
    assert torch.equal(flipped.logits, out.logits.flip(0))


def test_the_cap_must_not_be_negative():
    with pytest.raises(ValueError, match="eval_cache_mib must be >= 0, got -1"):
        load_config(REPO / "recipes" / "tiny" / "eagle3.yaml", {"eval_cache_mib": -1}, methods=methods())


def test_a_run_with_kept_states_logs_and_saves_what_one_without_does(text_data, tmp_path):
    def run(name: str, cap: int):
        overrides = {"eval_every": 2, "eval_cache_mib": cap, "max_steps": 4}
        cfg, _, _ = set_up("eagle3", text_data, tmp_path / name, **overrides)
        summary = loop.train(cfg, method_named(cfg.method), progress=False)
        lines = (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()
        evals = [json.loads(line) for line in lines if '"eval"' in line]
        return summary, evals, load_file(tmp_path / name / "run" / "model.safetensors")

    kept, kept_evals, kept_heads = run("kept", 1024)
    plain, plain_evals, plain_heads = run("plain", 0)
    assert [e["step"] for e in kept_evals] == [2, 4] and len(plain_evals) == 2
    assert all(same_metrics(a, b) for a, b in zip(kept_evals, plain_evals))
    assert kept_heads.keys() == plain_heads.keys()
    assert all(torch.equal(kept_heads[k], plain_heads[k]) for k in kept_heads)
    assert (
        same_metrics(kept["eval"], plain["eval"]) and kept["eval_seconds"] > 0 and plain["eval_seconds"] > 0
    )


def test_bench_held_out_reports_both_runs(text_data, tmp_path):
    """benchmarks/bench_held_out.py end to end on the tiny recipe (a smoke test: times are never asserted)."""
    overrides = [f"data=[{text_data}]", "max_steps=2", "eval_every=1", "eval_batches=2"]
    overrides += ["batch_size=4", "max_length=48"]
    out = tmp_path / "bench.json"
    result = bench_held_out.main(
        [str(REPO / "recipes" / "tiny" / "eagle3.yaml"), *overrides, "--out", str(out)]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["evaluations"] == 2 and result["close_eval_metrics"] and result["same_heads"]
    assert set(result["runs"]) == {"forward_each_time", "kept"}
    assert all(run["eval_seconds"] > 0 for run in result["runs"].values())


def test_bench_teacher_columns_finds_the_same_gathers(tmp_path):
    """benchmarks/bench_teacher_columns.py on small shapes (a smoke test: times are never asserted)."""
    out = tmp_path / "columns.json"
    sizes = ["--hidden", "16", "--vocab", "64", "--draft-vocab", "8", "--batch", "2", "--tokens", "5"]
    result = bench_teacher_columns.main([*sizes, "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["gather_equal"] and result["shapes"]["draft_vocab"] == 8
    assert set(result["seconds"]) == {"index_select", "indexing", "full_product", "argmax", "columns_product"}
    with pytest.raises(SystemExit):
        bench_teacher_columns.main([*sizes[:4], "--draft-vocab", "65"])
