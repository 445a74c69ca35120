"""The Medusa row of benchmarks/bench_trainers.py: medusa-llm 0.1's side (its README's training command, what
the bench changes of it, and one run of its train.py imported and decoded), and the ablations that put its
settings, or other learning rates, into our recipe."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_trainers_jobs import chat_target_view, evaluate, import_heads, load_average, row_result
from benchmarks.bench_trainers_modelopt import joined_overrides, warmup_like_hf

MEDUSA_LR = 1e-3  # medusa-llm 0.1's README --learning_rate
MEDUSA_README = {  # medusa-llm 0.1's README training command, less what cannot run here
    "--per_device_train_batch_size": "8",
    "--gradient_accumulation_steps": "4",
    "--learning_rate": f"{MEDUSA_LR:g}",
    "--weight_decay": "0.0",
    "--warmup_steps": "0.1",  # README: --warmup_ratio 0.1; transformers 5 takes the ratio here
    "--lr_scheduler_type": "cosine",
    "--medusa_num_heads": "3",
    "--medusa_num_layers": "1",
    "--lazy_preprocess": "True",
    "--save_strategy": "no",
    "--logging_steps": "1",
}
# on a chat target (SmolLM2): what its train.py can read of it
CHAT_TARGET_VIEW = chat_target_view("`<|endoftext|>` its pad", "preprocess")


def medusa_llm_changes(max_length: int, target: str = "tiny", lr: float = MEDUSA_LR) -> list[str]:
    """What the bench changes of medusa-llm's README run, for the bench's --max-length and --target and a
    run at --learning_rate `lr`."""
    context = " (the tiny target's context)" if target == "tiny" else ""
    return [
        "on the CPU without --bf16/--tf32; its train.py still loads the target in bf16 (hard-coded) and casts "
        "its heads to the target's dtype, so it trains bf16 heads (ours: fp32), slowly on this CPU",
        "1 process, not 4 GPUs (batch 8 x accumulation 4 per step, as one of its GPUs)",
        f"model_max_length {max_length}{context}, not 2048",
        "--num_train_epochs E for the budget (README: 1), --report_to none",
        "--warmup_steps 0.1 for --warmup_ratio 0.1 (transformers 5 dropped the name)",
        "the trainer_run.py shims (transformers 5 API, the heads' save, the tokenizer path)",
        *([f"--learning_rate {lr:g} (README: {MEDUSA_LR:g})"] if lr != MEDUSA_LR else []),
        *([] if target == "tiny" else [CHAT_TARGET_VIEW]),
    ]


# Ours with one of medusa-llm's settings instead of our recipe's (what each difference buys),
# as recipe overrides at a budget. Under Adam a per-head loss weight barely moves independent heads
# (it scales the head's gradients, which Adam divides out), so "decay 1" is expected to change little.
MEDUSA_ABLATIONS = {
    "warmup 10%": lambda b: {"warmup_steps": warmup_like_hf(b["steps"], 0.1)},  # theirs; ours: 20 steps
    "decay 1": lambda b: {"decay": 1.0},  # their loss sums the heads unweighted; ours 0.8**k
    "data labels": lambda b: {"labels": "data"},  # their labels are the text's; ours the target's
    # not theirs: ours with the target's top token as a hard label (the fix the "data labels" runs point to)
    "target top1": lambda b: {"labels": "target-top1"},
    # theirs: each head projects through a trainable copy of the target's lm_head. Every Medusa recipe's now
    # (SmolLM2's since 2026-12-05, when 32 prompts showed the shared one 2% behind medusa-llm), so
    # a no-op on them; "shared lm_head" is the frozen shared projection SmolLM2's recipe had before
    "own lm_head": lambda b: {"share_lm_head": False},
    "shared lm_head": lambda b: {"share_lm_head": True},
    "lr 2e-3": lambda b: {"lr": 2e-3},  # not theirs (both 1e-3): what lifted EAGLE-3 at its budget
    "lr 3e-3": lambda b: {"lr": 3e-3},
    "lr 5e-3": lambda b: {"lr": 5e-3},
    "lr 8e-3": lambda b: {"lr": 8e-3},
    "lr 1.2e-2": lambda b: {"lr": 1.2e-2},
    # not theirs: torch's Muon on the heads' blocks (train/optimizers.py) at 8 x lr, AdamW on the rest
    "muon": lambda b: {"optimizer": "muon"},
    "muon x4": lambda b: {"optimizer": "muon", "muon_lr_scale": 4.0},
}


def ablation_overrides(names: str, budget: dict) -> dict:
    """The overrides of a '+'-joined list of MEDUSA_ABLATIONS names at `budget`."""
    return joined_overrides(names, MEDUSA_ABLATIONS, "--medusa-ablations", budget)


def medusa_llm_row(budget: dict, seed: int, args, ctx: dict, lr: float = MEDUSA_LR) -> dict:
    """medusa-llm's train.py (its README's settings, --seed `seed`; --learning_rate `lr`, its README's
    unless given) at `budget`, imported and decoded."""
    import torch
    from trainer_run import finish_trainer, start_trainer

    e, other_lr = budget["epochs"], lr != MEDUSA_LR
    work = args.out / (f"medusa-llm-e{e}-s{seed}" + (f"-lr{lr:g}" if other_lr else ""))
    work.mkdir()
    (work / "train.json").write_text(json.dumps(ctx["sharegpt"]))
    torch.save({"hidden": torch.zeros(1, 4, ctx["hidden"])}, work / "inputs.pt")
    flags = {**MEDUSA_README, "--num_train_epochs": str(e), "--max_steps": None, "--report_to": "none",
             "--seed": str(seed), "--learning_rate": f"{lr:g}"}  # fmt: skip
    job = {"kind": "medusa", "work": str(work), "target": str(ctx["peer_target"]), "lr": lr,
           "max_length": args.max_length, "args": flags, "inputs": str(work / "inputs.pt"),
           "out": str(work / "out.pt")}  # fmt: skip
    load = load_average()
    got = finish_trainer(start_trainer(ctx["env"], job, work).wait(), job, work)
    native = import_heads("medusa", Path(got["checkpoint"]), ctx["target"], work / "native")
    ev = evaluate(native, args.medusa_tree, work / "eval", args.eval_prompts, args.eval_new_tokens, args.target,
                  ctx["eval_source"], args.device)  # fmt: skip
    trainer = "medusa-llm 0.1" + (f" (lr {lr:g})" if other_lr else "")
    changes = medusa_llm_changes(args.max_length, args.target, lr)
    row = row_result("Medusa", trainer, budget, ctx["vicuna_tokens"], ev, got["wall_s"],
                     got["maxrss_kb"] / 1024, changes, seed=seed, load_average=load)  # fmt: skip
    print(f"  {trainer} seed {seed}: tau {row['tau']:.3f} {row['identical']}", flush=True)
    return row
