"""Multi-process training gives what one process gives: 2 CPU processes (gloo), launched the way users
launch them (`accelerate launch --config_file recipes/accelerate/...`), against one process with the
same global batch, in fp32.

The rows all have the same length, so every process holds as many labels as every other: each process's
loss is the mean over its own labels and the processes' gradients are averaged (train/objective.py), which
equals the one-process mean exactly when the counts agree. 20 training rows split evenly into every batch
size used, so no epoch drops a tail and the one-process twin (tests/equivalence.py: the same run with its
micro-batches split otherwise) draws the same rows in the same order.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.heads import MedusaConfig, MedusaHeads
from specheads.methods import MEDUSA
from specheads.methods.medusa import MedusaSettings
from specheads.train.distributed import fill_deepspeed_config
from specheads.train.losses import medusa_loss
from specheads.train.objective import HeadsWithLoss
from specheads.train.sampler import EpochBatches

from equivalence import assert_same_weights, assert_within_rounding, max_value_gap
from helpers import tiny_model

REPO = Path(__file__).resolve().parents[2]
ROW_TOKENS = 32


@pytest.fixture(scope="module")
def equal_rows(tmp_path_factory) -> Path:
    """25 cyclic-text rows of exactly ROW_TOKENS byte tokens each (no padding anywhere): 20 to train on."""
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    rows = [{"text": (words[i % 4] * 8)[i % 7 :][:ROW_TOKENS]} for i in range(25)]
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe_args(recipe: str, target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        str(REPO / "recipes" / "tiny" / recipe),
        f"target={target}",
        f"data={data}",
        f"max_length={ROW_TOKENS}",
        "lr=0.01",
        "warmup_steps=2",
        "max_steps=6",  # 20 training rows, global batch 4: the run crosses an epoch boundary
        "eval_fraction=0.2",
        "eval_data=[]",  # the recipe evaluates on stdlib; these runs on a split of their data
        "eval_every=3",
        "eval_batches=2",
        "log_every=1",
        "report_to=none",
        f"output_dir={out}",
        *extra,
    ]


def partial_args(recipe: str, target: Path, data: Path, *fixed: str):
    """recipe_args with everything but the output directory (and per-run extras) fixed."""
    return lambda out, *extra: recipe_args(recipe, target, data, out, *fixed, *extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two(config: str, args: list[str]) -> None:
    """`accelerate launch --config_file recipes/accelerate/<config> --num_processes 2 -m specheads.train`
    from the repository root (the configs name their DeepSpeed files relative to it)."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate" / config),
        "--num_processes", "2", "--main_process_port", str(free_port()),
        "-m", "specheads.train", *args, "--no-progress",
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "PYTHONFAULTHANDLER": "1",
    }
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


def one(args: list[str]) -> None:
    assert cli_main(["train", *args, "--no-progress"]) == 0


def losses(out: Path) -> list[tuple]:
    return [(m["step"], m["split"], m["loss"]) for m in map(json.loads, (out / "metrics.jsonl").open())]


def assert_same_run(single: Path, multi: Path, twin: Path, fall: float = 0.9) -> None:
    """`multi` logs the losses and ends with the weights of `single`, within what reordering `single`'s
    sums moves them (`twin`; its eval rows depend on the batch size, so only its train losses count).
    `single`'s last train loss is below `fall` times its first."""
    a, b, c = losses(single), losses(multi), losses(twin)
    assert [x[:2] for x in a] == [x[:2] for x in b] and len(a) == 8  # 6 train logs + 2 evals
    assert [x[:2] for x in c if x[1] == "train"] == [x[:2] for x in a if x[1] == "train"]
    noise = max_value_gap([x[2] for x in a if x[1] == "train"], [x[2] for x in c if x[1] == "train"])
    assert_within_rounding(max_value_gap([x[2] for x in a], [x[2] for x in b]), noise, "losses")
    wa, wb, wc = (load_file(str(d / "model.safetensors")) for d in (single, multi, twin))
    assert_same_weights(wa, wb, wc)
    # and the heads did move: the comparison is not between two untrained copies
    assert a[-2][2] < fall * a[0][2]


def ddp_trio(args, tmp_path: Path) -> None:
    """The reference (1 process x batch 2 x grad_accum 2), its twin (batch 1 x grad_accum 4) and DDP (2
    processes x batch 1 x grad_accum 2) in tmp_path's one/, twin/ and two/."""
    one(args(tmp_path / "one", "batch_size=2", "grad_accum=2"))
    one(args(tmp_path / "twin", "batch_size=1", "grad_accum=4"))
    launch_two("ddp.yaml", args(tmp_path / "two", "batch_size=1", "grad_accum=2"))


def test_ddp_two_processes_match_one(tiny_target_dirs, equal_rows, tmp_path):
    """DDP, 2 processes x batch 1 x grad_accum 2 == 1 process x batch 2 x grad_accum 2 (Medusa)."""
    args = partial_args("medusa.yaml", tiny_target_dirs["llama"], equal_rows, "labels=data", "num_heads=3")
    ddp_trio(args, tmp_path)
    assert_same_run(tmp_path / "one", tmp_path / "two", tmp_path / "twin")
    summary = json.loads((tmp_path / "two" / "train_summary.json").read_text())
    assert summary["processes"] == 2
    assert summary["target_resident_parameters"] == [summary["target_parameters"]] * 2  # replicated


def test_ddp_two_processes_match_one_with_muon(tiny_target_dirs, equal_rows, tmp_path):
    """The same under Muon at its default rate (EAGLE-3): each process orthogonalises the averaged gradient
    of each whole matrix, as the one process does. The Newton-Schulz products in fp32 whatever the CPU: with
    bf16 products (torch's, muon_dtype "auto" on a CPU with bf16 units) this run's twin drifts 3e-2 from its
    reference, a unit gradient step turning roundings in weak directions into whole steps; fp32 keeps it at
    4e-6."""
    args = partial_args(
        "eagle3.yaml",
        tiny_target_dirs["llama"],
        equal_rows,
        "optimizer=muon",
        "muon_dtype=float32",
        "ttt_steps=2",
    )
    ddp_trio(args, tmp_path)
    # the loss falls 2.6% in its 6 steps; gradients left unsynchronised move it 1.5e5 times the twin's distance
    assert_same_run(tmp_path / "one", tmp_path / "two", tmp_path / "twin", fall=0.98)
    summary = json.loads((tmp_path / "two" / "train_summary.json").read_text())
    assert summary["processes"] == 2
    assert json.loads((tmp_path / "two" / "config.json").read_text())["training"]["optimizer"] == "muon"


def test_zero3_sharded_target_two_processes_match_one(tiny_target_dirs, equal_rows, tmp_path):
    """ZeRO-3, 2 processes x batch 2 == 1 process x batch 4 (EAGLE: the loss borrows the sharded
    target's embedding and lm_head, and backpropagates through the lm_head). No input noise: two
    processes draw it from two generators. Then resuming the 2-process run from a checkpoint (DeepSpeed's
    partitioned optimizer state, each process's RNG) reproduces it exactly."""
    # AdamW, as the config's header launches it: the recipe's Muon is refused under DeepSpeed
    args = partial_args("eagle.yaml", tiny_target_dirs["llama"], equal_rows, "noise=0", "optimizer=adamw")
    one(args(tmp_path / "one", "batch_size=4"))
    one(args(tmp_path / "twin", "batch_size=2", "grad_accum=2"))
    launch_two("zero3-sharded-target.yaml", args(tmp_path / "two", "batch_size=2", "save_every=3"))
    assert_same_run(tmp_path / "one", tmp_path / "two", tmp_path / "twin")
    summary = json.loads((tmp_path / "two" / "train_summary.json").read_text())
    total, resident = summary["target_parameters"], summary["target_resident_parameters"]
    whole = FrozenTarget.from_pretrained(str(tiny_target_dirs["llama"]), load_tokenizer=False)
    assert total == sum(p.numel() for p in whole.model.parameters())
    # each process holds its half of every weight (DeepSpeed pads each to an even split) and no more
    assert len(resident) == 2 and all(0.5 * total <= r <= 0.51 * total for r in resident), resident
    # and a 2-process ZeRO-3 run resumed from its step-3 checkpoint ends bit for bit where it did
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "two/checkpoints/step-3", tmp_path / "resumed/checkpoints/step-3")
    launch_two("zero3-sharded-target.yaml", args(tmp_path / "resumed", "batch_size=2", "resume=auto"))
    wa, wb = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("two", "resumed"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


# -- the pieces, in one process -------------------------------------------------------------------


def test_two_processes_draw_the_global_batches_of_one():
    """Process r takes rows r*B..(r+1)*B of every global batch, across epochs; the tail is dropped."""
    n = 22
    one = iter(EpochBatches(n, 4, seed=3))
    ranks = [iter(EpochBatches(n, 2, num_processes=2, rank=r, seed=3)) for r in range(2)]
    for _ in range(3 * (n // 4)):  # three epochs
        assert next(one) == next(ranks[0]) + next(ranks[1])
    with pytest.raises(ValueError, match="3 rows, fewer than one global batch .2 per process x 2 processes"):
        EpochBatches(3, 2, num_processes=2, rank=0)


def test_batches_follow_the_shuffling_dataloader_of_earlier_runs():
    """One process draws exactly what DataLoader(shuffle=True, drop_last, seeded generator) drew, epoch
    after epoch, so single-process runs (and their pinned losses) did not move."""
    for n, batch in [(23, 4), (24, 4), (3, 4)]:
        loader = DataLoader(
            list(range(n)),
            batch_size=batch,
            shuffle=True,
            drop_last=n >= batch,
            generator=torch.Generator().manual_seed(7),
        )
        expected = [b.tolist() for _ in range(4) for b in loader]
        drawn = iter(EpochBatches(n, batch, seed=7))
        assert [next(drawn) for _ in expected] == expected


def test_heads_with_loss_owns_only_the_heads_and_covers_every_weight():
    """The wrapper DDP sees: the target is no submodule (its weights are not trained or synced); its loss
    is medusa_loss; a batch too short for the last heads still puts all of them in the graph."""
    target = FrozenTarget(tiny_model("llama"))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=264, num_heads=3))
    heads.init_lm_heads_from(target.lm_head)
    model = HeadsWithLoss(
        heads, MEDUSA.loss, capture_layers=heads.capture_layers, settings=MedusaSettings(decay=0.8)
    )
    assert [p for p in model.parameters()] == [p for p in heads.parameters()]
    ids = torch.randint(0, 264, (2, 9))
    batch = {
        "input_ids": ids,
        "loss_mask": torch.ones(2, 9),
        "position_ids": torch.arange(9).expand(2, 9),
        "attention_mask": torch.ones(2, 9, dtype=torch.long),
    }
    out = target(ids, position_ids=batch["position_ids"], capture=model.capture_layers, logits=False)
    loss, metrics = model(batch, out, target)
    expected, expected_metrics = medusa_loss(
        heads,
        out.hidden[4],
        ids,
        batch["loss_mask"],
        batch["position_ids"],
        decay=0.8,
        lm_head=target.lm_head,
    )
    assert torch.equal(loss, expected) and torch.equal(metrics, expected_metrics.as_tensor())
    short = {k: v[:, :3] for k, v in batch.items()}  # T = 3: only head 0 (offset 2) has a label
    out = target(short["input_ids"], position_ids=short["position_ids"], capture=(-1,), logits=False)
    model(short, out, target)[0].backward()
    assert all(p.grad is not None for p in model.parameters())


def test_deepspeed_auto_values_come_from_the_recipe():
    from specheads.train.config import TrainConfig

    def accelerator(config):
        plugin = SimpleNamespace(deepspeed_config=config)
        return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), num_processes=2)

    cfg = TrainConfig(batch_size=3, grad_accum=2, max_grad_norm=0.5)
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "zero_optimization": {}}
    fill_deepspeed_config(accelerator(config), cfg)
    assert config["train_micro_batch_size_per_gpu"] == 3 and config["gradient_accumulation_steps"] == 2
    assert config["gradient_clipping"] == 0.5 and config["train_batch_size"] == 12
    with pytest.raises(
        ValueError, match="gradient_clipping: DeepSpeed config has 1.0, the recipe makes it 0.5"
    ):
        fill_deepspeed_config(accelerator({"gradient_clipping": 1.0}), cfg)


def test_zero3_sharded_target_starts_an_eagle3_head_from_its_whole_rows(
    tiny_target_dirs, equal_rows, tmp_path
):
    """draft_head_init=target under ZeRO-3 (the SmolLM2 EAGLE-3 recipe sets it): the target's lm_head and final
    norm are partitioned when the head is built, so both are gathered first. After a step at lr 1e-30 the saved head
    still holds the target's whole rows of its draft vocabulary and the target's final norm."""
    args = partial_args(
        "eagle3.yaml",
        tiny_target_dirs["llama"],
        equal_rows,
        "noise=0",
        "optimizer=adamw",
        "draft_head_init=target",
        "draft_vocab_size=40",
        "lr=1e-30",  # a step that moves no weight (lr 0 is refused)
        "max_steps=1",
        "ttt_steps=2",
    )
    launch_two("zero3-sharded-target.yaml", args(tmp_path / "two", "batch_size=2"))
    whole = FrozenTarget.from_pretrained(str(tiny_target_dirs["llama"]), load_tokenizer=False)
    saved = load_file(str(tmp_path / "two" / "model.safetensors"))
    ids = torch.arange(40) + saved["d2t"]
    assert torch.equal(saved["lm_head.weight"], whole.lm_head.weight[ids])
    assert torch.equal(saved["norm.weight"], whole.norm.weight)
