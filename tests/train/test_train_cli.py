"""`specheads train` end to end on a tiny random target: losses fall, files are whole, all launch forms work."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scripts import add_label_counts
from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.heads import load_heads
from specheads.heads.checkpoint import draft_vocab_ids, read_label_counts
from specheads.methods import methods
from specheads.train.provenance import PACKAGES
from specheads.version import __version__

from helpers import tiny_mixed_model, tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"


def args(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        str(RECIPE),
        f"target={target}",
        f"data={data}",
        "max_length=64",
        "batch_size=8",
        "medusa.num_heads=3",
        "medusa.labels=data",  # pinned here: the recipe's own default may change
        "lr=0.01",
        "warmup_steps=2",
        "max_steps=40",
        "eval_fraction=0.1",
        "eval_data=[]",  # the recipe evaluates on stdlib; these runs on a split of their data
        "eval_every=20",
        "eval_batches=2",
        "log_every=10",
        f"output_dir={out}",
        *extra,
    ]


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_target_refusing_sdpa_trains_with_the_attention_it_supports(text_data, tmp_path):
    """transformers refuses sdpa for Gemma-2 (its eager attention softcaps the scores): the recipe's default
    attn_implementation, auto, loads it eager, and Medusa heads train on it."""
    target_dir, out = tmp_path / "gemma2", tmp_path / "run"
    tokenizer = tiny_tokenizer()
    tiny_mixed_model("gemma2", vocab_size=len(tokenizer)).save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    steps = ["max_steps=20", "eval_every=20", "log_every=10"]
    assert cli_main(["train", *args(target_dir, text_data, out, *steps), "--no-progress"]) == 0
    train = [m for m in read_metrics(out) if m["split"] == "train"]
    assert [m["step"] for m in train] == [10, 20] and train[-1]["loss"] < train[0]["loss"]
    target = FrozenTarget.from_pretrained(str(target_dir))
    assert target.attention_choice == "auto: eager, as transformers refuses sdpa for Gemma2ForCausalLM"
    heads, config = load_heads(out, target, methods=methods())
    assert heads.num_heads == 3 and config["training"]["attn_implementation"] == "auto"


def test_train_cli_learns_and_writes_a_whole_checkpoint(tiny_target_dirs, text_data, tmp_path, capsys):
    target_dir = tiny_target_dirs["llama"]
    out = tmp_path / "run"
    assert cli_main(["train", *args(target_dir, text_data, out, "save_every=20"), "--no-progress"]) == 0
    assert "held-out top-1 per head" in capsys.readouterr().out
    metrics = read_metrics(out)
    train = [m for m in metrics if m["split"] == "train"]
    evals = [m for m in metrics if m["split"] == "eval"]
    assert [m["step"] for m in train] == [10, 20, 30, 40] and [m["step"] for m in evals] == [20, 40]
    # Deterministic on one machine; pinned loosely enough for other CPUs' rounding.
    assert train[0]["loss"] == pytest.approx(8.6130, rel=2e-3)
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert evals[-1]["head0/top1"] > 0.6 and evals[-1]["tau_sim"] > 1.5
    target = FrozenTarget.from_pretrained(str(target_dir))
    heads, config = load_heads(out, target, methods=methods())
    assert heads.num_heads == 3 and config["training"]["max_steps"] == 40
    assert config["training"]["eval"]["tau_sim"] == evals[-1]["tau_sim"]
    assert (out / "checkpoints" / "step-20" / "model.safetensors").is_file()
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 40 and summary["step_to_target_forward_ratio"] > 1
    assert summary["completed"] and summary["processes"] == 1
    assert summary["target_resident_parameters"] == [summary["target_parameters"]]
    # the step-20 checkpoint is a head checkpoint and a resumable training state
    state = json.loads((out / "checkpoints" / "step-20" / "trainer_state.json").read_text())
    assert state["step"] == 20 and state["global_batches"] == 20 and state["num_processes"] == 1
    # beside the heads: how often each token was a label in the training rows (decoding's --draft-vocab)
    from specheads.train import prepare
    from specheads.train.eagle_losses import count_label_tokens
    from specheads.train.recipe import load_config

    cfg = load_config(RECIPE, args(target_dir, text_data, out)[1:], methods=methods())
    train_rows, _, _ = prepare.make_data(cfg, target.tokenizer)
    counts = count_label_tokens(train_rows, target.vocab_size)
    assert counts.sum() > 0
    for folder in (out, out / "checkpoints" / "step-20"):
        assert torch.equal(read_label_counts(folder), counts), folder
    top = draft_vocab_ids(out, 16, target.vocab_size)
    # heads saved without them get the same counts from scripts/add_label_counts.py
    (out / "checkpoints" / "step-20" / "label_counts.safetensors").unlink()
    assert add_label_counts.main([str(out / "checkpoints" / "step-20"), str(tmp_path / "counted")]) == 0
    assert torch.equal(read_label_counts(tmp_path / "counted"), counts)
    assert (
        top.tolist() == sorted(top.tolist()) and counts[top].min() >= counts.sort(descending=True).values[15]
    )


def test_same_seed_gives_the_same_heads(tiny_target_dirs, text_data, tmp_path):
    import torch

    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        cli_main(
            [
                "train",
                *args(tiny_target_dirs["qwen3"], text_data, out, "max_steps=6", "eval_every=6"),
                "--no-progress",
            ]
        )
        outs.append(load_heads(out, methods=methods())[0].state_dict())
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


def test_grad_accum_and_shared_lm_head_run(tiny_target_dirs, text_data, tmp_path):
    out = tmp_path / "run"
    extra = (
        "max_steps=4",
        "grad_accum=2",
        "medusa.share_lm_head=true",
        "medusa.labels=target",
        "eval_every=4",
    )
    assert (
        cli_main(["train", *args(tiny_target_dirs["mistral"], text_data, out, *extra), "--no-progress"]) == 0
    )
    heads, config = load_heads(out, methods=methods())
    assert heads.lm_heads is None and config["head_config"]["share_lm_head"] is True


def test_wandb_offline_run_and_provenance(tiny_target_dirs, text_data, tmp_path, monkeypatch):
    """report_to=wandb without WANDB_API_KEY writes an offline wandb run under output_dir (no network);
    provenance.jsonl records what the run was."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    extra = ("max_steps=2", "eval_every=2", "log_every=1", "report_to=wandb", "run_name=offline-test")
    assert cli_main(["train", *args(tiny_target_dirs["llama"], text_data, out, *extra), "--no-progress"]) == 0
    (run,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    logged, deadline = run.read_bytes(), time.monotonic() + 60
    while b"eval/" not in logged and time.monotonic() < deadline:  # wandb's service writes it after finish
        time.sleep(0.2)
        logged = run.read_bytes()
    for key in ("loss", "head0/top1", "head2/top5", "tau_sim", "lr", "grad_norm", "labels_per_second"):
        assert f"train/{key}".encode() in logged, key
    assert b"eval/head1/top1" in logged and b"offline-test" in logged

    (launch,) = [json.loads(line) for line in (out / "provenance.jsonl").read_text().splitlines()]
    assert launch["config"]["max_steps"] == 2 and launch["config"]["report_to"] == ["wandb"]
    assert launch["num_processes"] == 1 and launch["resumed_from"] is None
    assert launch["host"] == socket.gethostname() and isinstance(launch["command"], list)
    assert set(launch["packages"]) == set(PACKAGES) and launch["packages"]["specheads"] == __version__
    import torch

    assert launch["packages"]["torch"] == torch.__version__
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout: the commit and a dirty flag
        assert launch["git"]["commit"] == head.stdout.strip() and isinstance(launch["git"]["dirty"], bool)
    else:
        assert launch["git"] is None


def test_unknown_key_fails_before_any_work(tiny_target_dirs, text_data, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="unknown recipe key on the command line: 'num_head' .*num_heads"):
        cli_main(["train", *args(tiny_target_dirs["llama"], text_data, out, "num_head=2")])
    assert not out.exists()


def _run(cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
    }
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "launcher",
    [
        [sys.executable, "-m", "specheads.train"],
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--cpu",
            "--num_processes",
            "1",
            "-m",
            "specheads.train",
        ],
    ],
    ids=["python-m", "accelerate-launch"],
)
def test_launch_forms(launcher, tiny_target_dirs, text_data, tmp_path):
    out = tmp_path / "run"
    extra = ("max_steps=2", "eval_every=2")
    result = _run(
        [*launcher, *args(tiny_target_dirs["llama"], text_data, out, *extra), "--no-progress"], tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "config.json").is_file() and (out / "train_summary.json").is_file()
