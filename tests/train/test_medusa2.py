"""Medusa-2 on a tiny llama: only heads and LoRA weights train, the teacher is the un-adapted model,
the saved adapter is a standard peft adapter that reproduces the adapted logits, λ0 is pinned; and
through `specheads train recipes/tiny/medusa2.yaml`: the base stays bit-identical, adapter/ and the
heads load, checkpoints hold heads + adapter only and resume exactly."""

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from scripts import bench_efficiency
from specheads.core.target import FrozenTarget
from specheads.data import collate, load_rows, tokenize_rows
from specheads.heads import MedusaConfig, MedusaHeads
from specheads.methods import methods
from specheads.train.medusa2 import (
    Medusa2WithLoss,
    adapter_parameters,
    lambda0,
    medusa2_loss,
    param_groups,
    save_adapter,
    teacher_logits,
    wrap_target_with_lora,
)

from equivalence import assert_same_weights, assert_within_rounding, max_value_gap
from helpers import command, tiny_model, tiny_tokenizer

train_cli = command("train")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(text_data):
    tokenizer = tiny_tokenizer()
    rows = tokenize_rows(load_rows(str(text_data)), tokenizer, max_length=32, loss_on="all")
    return collate(
        [rows[i] for i in range(4)], pad_token_id=tokenizer.pad_token_id, packing=False, max_length=32
    )


def fresh_target() -> FrozenTarget:
    tokenizer = tiny_tokenizer()
    return FrozenTarget(
        tiny_model("llama", seed=0, vocab_size=len(tokenizer)), tokenizer, name_or_path="tiny-llama"
    )


def logits_of(target: FrozenTarget, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return target(
            batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits


@pytest.fixture(scope="module")
def trained(batch):
    """A Medusa-2 run of 4 optimizer steps; returns what the tests inspect."""
    target = fresh_target()
    original = copy.deepcopy(target.model)
    wrapped = wrap_target_with_lora(target, r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=wrapped.vocab_size, num_heads=2))
    heads.init_lm_heads_from(wrapped.lm_head)
    base_before = {n: p.detach().clone() for n, p in wrapped.model.named_parameters() if ".lora_" not in n}
    adapter_before = {n: p.detach().clone() for n, p in adapter_parameters(wrapped)}
    heads_before = {n: p.detach().clone() for n, p in heads.named_parameters()}
    groups = param_groups(heads, wrapped, lr_heads=1e-2, lr_adapter=1e-3)
    optimizer = torch.optim.AdamW(groups)
    parts, grads_seen = [], set()
    for step in range(4):
        loss, metrics, part = medusa2_loss(heads, wrapped, batch, lambda0=lambda0(step + 1, 4, peak=0.5))
        loss.backward()
        parts.append(part)
        grads_seen |= {n for n, p in wrapped.model.named_parameters() if p.grad is not None}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "wrapped": wrapped,
        "original": original,
        "heads": heads,
        "groups": groups,
        "parts": parts,
        "metrics": metrics,
        "grads_seen": grads_seen,
        "before": (base_before, adapter_before, heads_before),
    }


def test_only_heads_and_adapters_train(trained):
    wrapped, heads = trained["wrapped"], trained["heads"]
    base_before, adapter_before, heads_before = trained["before"]
    adapter_names = set(adapter_before)
    assert len(adapter_names) == 4 * 3 * 2  # 4 layers x (q, v, down) x (A, B)
    assert trained["grads_seen"] == adapter_names  # no base weight ever got a gradient
    for name, p in wrapped.model.named_parameters():
        if name in adapter_names:
            assert p.requires_grad and not torch.equal(p, adapter_before[name]), name
        else:
            assert not p.requires_grad and torch.equal(p, base_before[name]), name
    assert all(not torch.equal(p, heads_before[n]) for n, p in heads.named_parameters())
    names = [g["name"] for g in trained["groups"]]
    lrs = [g["lr"] for g in trained["groups"]]
    assert names == ["heads", "adapter"] and lrs == [1e-2, 1e-3]
    in_groups = {id(p) for g in trained["groups"] for p in g["params"]}
    expected = {id(p) for p in heads.parameters()} | {id(p) for _, p in adapter_parameters(wrapped)}
    assert in_groups == expected
    # B starts at zero: the adapted target starts equal to the original, then moves off it.
    kls = [p["target_kl"] for p in trained["parts"]]
    assert kls[0] == 0.0 and kls[-1] > 0
    assert [p["lambda0"] for p in trained["parts"]] == [lambda0(s, 4, peak=0.5) for s in (1, 2, 3, 4)]
    assert trained["metrics"].count[0] > 0


def test_teacher_is_the_unadapted_model(trained, batch):
    wrapped = trained["wrapped"]
    teacher = teacher_logits(wrapped, batch)
    original = trained["original"](
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits
    torch.testing.assert_close(teacher, original, rtol=0, atol=0)
    assert (logits_of(wrapped, batch) - teacher).abs().max() > 1e-4  # the adapters are on outside it


def test_saved_adapter_reproduces_adapted_logits(trained, batch, tmp_path):
    from peft import PeftModel

    wrapped = trained["wrapped"]
    path = save_adapter(wrapped, tmp_path / "heads")
    assert path == tmp_path / "heads" / "adapter"
    assert sorted(p.name for p in path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == "tiny-llama"
    with safe_open(str(path / "adapter_model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert len(keys) == 24 and all(".lora_A." in k or ".lora_B." in k for k in keys)

    adapted = logits_of(wrapped, batch)
    base = tiny_model("llama", seed=0, vocab_size=len(tiny_tokenizer()))  # a fresh copy of the base
    restored = FrozenTarget(PeftModel.from_pretrained(base, str(path)), tiny_tokenizer())
    torch.testing.assert_close(logits_of(restored, batch), adapted, rtol=0, atol=1e-6)
    merged = fresh_target().with_adapter(path)
    assert not any(".lora_" in n for n, _ in merged.model.named_parameters())
    torch.testing.assert_close(logits_of(merged, batch), adapted, rtol=1e-4, atol=1e-4)


def test_lambda0_schedule_pinned():
    assert lambda0(0, 100) == 0.0
    assert lambda0(50, 100) == pytest.approx(0.2 * math.sqrt(0.5), abs=1e-15)  # 0.2 sin(π/4)
    assert lambda0(100, 100) == pytest.approx(0.2) and lambda0(150, 100) == pytest.approx(0.2)
    assert lambda0(25, 100, schedule="linear") == pytest.approx(0.05)
    assert lambda0(25, 100, warmup=0.5) == pytest.approx(0.2 * math.sqrt(0.5))
    assert lambda0(50, 100, warmup=0.5) == pytest.approx(0.2) == lambda0(80, 100, warmup=0.5)
    assert lambda0(0, 100, schedule="constant", peak=1.0) == 1.0
    assert [round(lambda0(s, 4, peak=0.5), 6) for s in range(5)] == [0.0, 0.191342, 0.353553, 0.46194, 0.5]
    with pytest.raises(ValueError, match="unknown λ0 schedule 'cosine'"):
        lambda0(1, 10, schedule="cosine")


def test_bad_lora_settings_are_errors(batch):
    target = fresh_target()
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] are not linear layers of LlamaForCausalLM"):
        wrap_target_with_lora(target, target_modules=("q_proj", "qkv_proj"))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=target.vocab_size, num_heads=1))
    with pytest.raises(TypeError, match="wrap_target_with_lora"):
        param_groups(heads, target, 1e-3, 1e-4)
    with pytest.raises(TypeError, match="wrap_target_with_lora"):
        medusa2_loss(heads, target, batch, lambda0=0.1)


def test_module_form_trains_only_heads_and_adapters(batch):
    wrapped = wrap_target_with_lora(fresh_target(), r=2, alpha=4, target_modules=("o_proj",))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=wrapped.vocab_size, num_heads=2))
    model = Medusa2WithLoss(heads, wrapped, decay=0.8, topk=3)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for g in param_groups(heads, wrapped, 1.0, 1.0) for p in g["params"]}
    loss, metrics = model(batch, 0.3)
    expected, head_metrics, parts = medusa2_loss(heads, wrapped, batch, lambda0=0.3, decay=0.8, topk=3)
    assert loss.item() == expected.item() and torch.equal(metrics[:, :2], head_metrics.as_tensor())
    assert metrics.shape == (4, 3) and metrics[3, 0] > 0
    # the last column carries the target's KL as a sum over its positions, so sums add up
    n = parts["target_kl_positions"]
    assert n > 0 and metrics[:, 2].tolist() == [parts["target_kl"] * n, 0.0, 0.0, n]
    summary = Medusa2WithLoss.summarise(metrics + metrics, decay=0.8, topk=3)
    assert summary["target_kl"] == pytest.approx(parts["target_kl"], abs=1e-12)
    assert summary["head0/top1"] == head_metrics.top1[0] / head_metrics.count[0]
    short = {k: v[:, :2] for k, v in batch.items()}  # no head has a label: every head still in the graph
    model(short, 0.3)[0].backward()
    assert all(p.grad is not None for p in heads.parameters())


# -- through `specheads train` ----------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
CLI_STEPS = 4


def medusa2_args(target_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        str(REPO / "recipes" / "tiny" / "medusa2.yaml"),
        f"target={target_dir}",
        f"data={data}",
        "max_length=48",
        "batch_size=4",
        "num_heads=2",
        "lora_r=4",
        "lora_alpha=8",
        "lr=0.01",
        "lr_adapter=0.01",
        "lambda0=0.5",
        "warmup_steps=2",
        f"max_steps={CLI_STEPS}",
        "eval_fraction=0.1",
        f"eval_every={CLI_STEPS}",
        "eval_batches=2",
        "log_every=1",
        "save_every=2",
        "report_to=none",
        f"output_dir={out}",
        *extra,
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def cli_run(tiny_target_dirs, text_data, tmp_path_factory):
    """`specheads train recipes/tiny/medusa2.yaml` on the tiny llama; keeps the run's adapted target."""
    from specheads.methods import medusa2 as medusa2_method

    out = tmp_path_factory.mktemp("medusa2") / "run"
    wrapped = []

    def keep(*args, **kwargs):
        wrapped.append(wrap_target_with_lora(*args, **kwargs))
        return wrapped[-1]

    patch = pytest.MonkeyPatch()
    patch.setattr(medusa2_method, "wrap_target_with_lora", keep)  # the entry's objective wraps the target
    try:
        assert train_cli(medusa2_args(tiny_target_dirs["llama"], text_data, out)) == 0
    finally:
        patch.undo()
    return out, wrapped[0], tiny_target_dirs["llama"]


def test_cli_changes_only_heads_and_adapters(cli_run, batch):
    from peft import PeftModel

    from specheads.heads import load_heads

    out, wrapped, target_dir = cli_run
    base = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    original = dict(base.model.named_parameters())
    adapters = 0
    for name, p in wrapped.model.named_parameters():
        if ".lora_" in name:
            adapters += 1
            continue
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(p, original[plain]), name  # the base is bit-identical after training
    assert adapters == len(adapter_parameters(wrapped)) == 4 * 7 * 2  # every projection: A and B
    assert all(p.abs().max() > 0 for n, p in adapter_parameters(wrapped) if ".lora_B." in n)  # B left 0

    # adapter/ is a peft adapter that rebuilds the run's adapted target from the base on disk
    restored = PeftModel.from_pretrained(base.model, str(out / "adapter"))
    torch.testing.assert_close(
        logits_of(FrozenTarget(restored), batch), logits_of(wrapped, batch), rtol=0, atol=1e-6
    )
    # the heads are native heads for the target, trained off their zero-initialised blocks
    heads, config = load_heads(out, FrozenTarget.from_pretrained(str(target_dir)), methods=methods())
    assert isinstance(heads, MedusaHeads) and heads.num_heads == 2
    assert all(block[0].linear.weight.abs().max() > 0 for block in heads.blocks)
    assert config["training"]["method"] == "medusa2" and config["training"]["adapter"] == "adapter"


def test_cli_logs_medusa_metrics_with_lambda0_and_kl(cli_run):
    out = cli_run[0]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4] and records[-1]["split"] == "eval"
    assert [r["lambda0"] for r in train] == [lambda0(s, CLI_STEPS, peak=0.5) for s in range(4)]
    assert [r["lr_adapter"] for r in train] == [r["lr"] for r in train]  # one schedule, equal rates here
    assert abs(train[0]["target_kl"]) < 1e-6 < train[-1]["target_kl"]  # B = 0 at first, then it moves
    for record in records:
        assert {"head0/top1", "head1/top1", "loss", "tau_sim", "target_kl"} <= record.keys()
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["completed"] and summary["target_forward_seconds"] is None


def test_cli_checkpoint_holds_heads_and_adapter_only_and_resumes_exactly(cli_run, text_data, tmp_path):
    from safetensors.torch import load_file

    from specheads.heads import load_heads

    out, wrapped, target_dir = cli_run
    step = out / "checkpoints" / "step-2"
    assert (step / "adapter" / "adapter_model.safetensors").is_file() and (
        step / "model.safetensors"
    ).is_file()
    files = sorted(p.name for p in (step / "accelerate").iterdir())
    assert not [f for f in files if f.startswith(("model", "pytorch_model"))], files  # no weights here
    # the optimizer state covers the heads and the adapters, nothing of the base
    optimizer = torch.load(step / "accelerate" / "optimizer.bin", weights_only=False)
    heads, _ = load_heads(step, methods=methods())
    assert [g["name"] for g in optimizer["param_groups"]] == ["heads", "adapter"]
    assert len(optimizer["state"]) == len(list(heads.parameters())) + len(adapter_parameters(wrapped))

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(step, resumed / "checkpoints" / "step-2")
    assert train_cli(medusa2_args(target_dir, text_data, resumed, "resume=auto")) == 0
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(out / name)), load_file(str(resumed / name))
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), name


def test_zero3_two_processes_match_one_and_resume_exactly(tiny_target_dirs, tmp_path):
    """DeepSpeed ZeRO-3 over 2 CPU processes (the target's base, the adapters and the heads all
    partitioned in one engine) logs the losses of 1 process x the same global batch and ends with the
    same heads and adapter; its checkpoints hold no frozen weight, and a resumed run ends bit for bit
    where the uninterrupted one did. Rows of equal length: each process holds as many labels."""
    import os
    import socket
    import subprocess
    import sys

    from safetensors.torch import load_file

    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": (words[i % 4] * 8)[i % 7 :][:32]}) + "\n" for i in range(24)))

    def args(out, *extra):
        fixed = ("max_length=32", "eval_fraction=0.2", "eval_every=3", "num_heads=3", "max_steps=6")
        return medusa2_args(tiny_target_dirs["llama"], data, out, *fixed, *extra)

    def launch_two(out, *extra):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(REPO / "recipes" / "accelerate" / "zero3-sharded-target.yaml"),
            "--num_processes", "2", "--main_process_port", str(port),
            "-m", "specheads.train", *args(out, "batch_size=1", *extra),
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

    assert train_cli(args(tmp_path / "one", "batch_size=2", "save_every=0")) == 0
    # the twin: the same rows and math with micro-batches split otherwise (tests/equivalence.py)
    assert train_cli(args(tmp_path / "twin", "batch_size=1", "grad_accum=2", "save_every=0")) == 0
    launch_two(tmp_path / "two", "save_every=3")
    one, two, twin = (
        [
            (r["step"], r["split"], r["loss"], r["target_kl"])
            for r in map(json.loads, (d / "metrics.jsonl").open())
        ]
        for d in (tmp_path / "one", tmp_path / "two", tmp_path / "twin")
    )
    assert [r[:2] for r in one] == [r[:2] for r in two] and len(one) == 8  # 6 train logs + 2 evals
    train = [i for i, r in enumerate(one) if r[1] == "train"]
    assert [r[:2] for r in twin if r[1] == "train"] == [one[i][:2] for i in train]
    twin_train = [r for r in twin if r[1] == "train"]
    for col, what in ((2, "loss"), (3, "target_kl")):  # eval rows depend on the batch size: train only
        noise = max_value_gap([one[i][col] for i in train], [r[col] for r in twin_train])
        assert_within_rounding(max_value_gap([r[col] for r in one], [r[col] for r in two]), noise, what)
    assert one[-1][3] > 0  # the adapters moved the target
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b, c = (load_file(str(tmp_path / d / name)) for d in ("one", "two", "twin"))
        assert_same_weights(a, b, c, name)

    # The engine's checkpoint: heads and adapters only (no frozen weight, no copy of the base).
    states = list((tmp_path / "two/checkpoints/step-3/accelerate").rglob("*model_states.pt"))
    assert len(states) == 2
    for path in states:
        saved = torch.load(path, weights_only=False)
        assert all(k.startswith("heads.") or ".lora_" in k for k in saved["module"]), list(saved["module"])
        assert not saved.get("frozen_param_fragments")
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "two/checkpoints/step-3", tmp_path / "resumed/checkpoints/step-3")
    launch_two(tmp_path / "resumed", "resume=auto")
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(tmp_path / "two" / name)), load_file(str(tmp_path / "resumed" / name))
        assert all(torch.equal(a[k], b[k]) for k in a), name


QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a short note about the sea."]},
    {"question_id": 2, "category": "writing", "turns": ["Describe a quiet morning."]},
]


def test_eval_decodes_medusa2_heads_with_their_adapter_merged(cli_run, tmp_path, monkeypatch):
    """`specheads eval` on a Medusa-2 run decodes (and runs generate() on) the adapted target: the
    base with adapter/ merged in, which is the model the heads were trained to read."""
    from specheads.cli import main as cli_main
    from specheads.evaluate import run as evaluate  # the library's eval run builds the decoder

    out, _, target_dir = cli_run
    seen = []
    decoder = evaluate.SpeculativeDecoder
    monkeypatch.setattr(evaluate, "SpeculativeDecoder", lambda t, d: seen.append(t) or decoder(t, d))
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    args = ["eval", "--target", str(target_dir), "--heads", str(out), "--prompts", str(prompts)]
    args += ["--out", str(tmp_path / "eval"), "--max-new-tokens", "8", "--warmup", "0", "--no-progress"]
    assert cli_main(args) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["heads"]["adapter"] == str((out / "adapter").resolve())
    assert results["identical_to_baseline"] == "2/2"
    used = dict(seen[0].model.named_parameters())
    assert not any(".lora_" in name for name in used)  # merged, not wrapped
    base = FrozenTarget.from_pretrained(str(target_dir), dtype="float32")
    merged = dict(base.with_adapter(out / "adapter").model.named_parameters())
    base = dict(FrozenTarget.from_pretrained(str(target_dir), dtype="float32").model.named_parameters())
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(used[name], base[name])  # the adapter moved the weights ...
    for name, p in used.items():
        torch.testing.assert_close(p, merged[name], rtol=0, atol=0)  # ... exactly as merging it does


def test_compare_keeps_an_adapted_target_to_its_own_heads(cli_run, tmp_path):
    from specheads.cli import main as cli_main

    out, _, target_dir = cli_run
    plain = tmp_path / "plain"
    shutil.copytree(out, plain, ignore=shutil.ignore_patterns("adapter"))
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    args = [
        "compare",
        "--target",
        str(target_dir),
        "--heads",
        str(out),
        str(plain),
        "--prompts",
        str(prompts),
    ]
    with pytest.raises(ValueError, match="carry a Medusa-2 adapter, which makes the target another model"):
        cli_main([*args, "--out", str(tmp_path / "cmp"), "--no-progress"])


def test_bench_efficiency_times_medusa2_heads_on_their_adapted_target(cli_run, tmp_path, monkeypatch):
    """scripts/bench_efficiency.py decodes Medusa-2 heads, and runs generate(), on the base with their
    adapter merged (as eval does), and refuses them beside heads of the plain target (as compare does)."""

    out, _, target_dir = cli_run
    seen = []
    decoder = bench_efficiency.SpeculativeDecoder
    monkeypatch.setattr(bench_efficiency, "SpeculativeDecoder", lambda t, d: seen.append(t) or decoder(t, d))
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    argv = ["--target", str(target_dir), "--prompts", str(prompts), "--max-new-tokens", "6", "--sizes", "1"]
    argv += ["--repeats", "1", "--tree", "medusa-15", "--out", str(tmp_path / "eff.json")]
    assert bench_efficiency.main([*argv, "--heads", str(out)]) == 0
    merged = dict(
        FrozenTarget.from_pretrained(str(target_dir)).with_adapter(out / "adapter").model.named_parameters()
    )
    for name, p in seen[0].model.named_parameters():
        torch.testing.assert_close(p, merged[name], rtol=0, atol=0)
    assert json.loads((tmp_path / "eff.json").read_text())["heads"][0]["identical_to_generate"] == "2/2"

    plain = tmp_path / "plain"
    shutil.copytree(out, plain, ignore=shutil.ignore_patterns("adapter"))
    with pytest.raises(ValueError, match="carry a Medusa-2 adapter, which makes the target another model"):
        bench_efficiency.main([*argv, "--heads", str(out), str(plain)])
