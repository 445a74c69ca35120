"""The EAGLE row of benchmarks/bench_trainers.py: eagle-llm 1.2.1's side (its ge_data + main.py run at one
learning rate, what the bench changes of it, and its saved states imported and decoded at each budget)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.bench_trainers_jobs import (
    EAGLE_BS,
    chat_target_view,
    eagle_budget,
    evaluate,
    import_heads,
    row_result,
)

EAGLE_LLM_ROPE_THETA = 10000.0  # cnets.LlamaRotaryEmbedding's default base; the config's is not read
EAGLE_EPOCHS = 21  # main.py: `for epoch in range(num_epochs + 1)` with num_epochs 20
EAGLE_SAVED = tuple(e for e in range(EAGLE_EPOCHS) if (e + 1) % 5)  # main.py saves state_e for these
EAGLE_LR = 3e-5  # main.py's --lr default (linear warm-up over 2000 steps, hard-coded)
PEER_CHANGES = {
    "eagle-llm": [
        "CPU fp32 (accelerate's bf16 autocast kept as main.py sets it; no CUDA)",
        "the trainer_run.py shims (CUDA calls, EConfig rope_scaling, an index file, DataLoader workers "
        "in-process, hard-coded paths, wandb disabled)",
    ],
}


# ours with other settings at the largest EAGLE budget (--eagle-ablations): recipe overrides at a budget.
# Muon is what lifted our EAGLE-3 beyond Model Optimizer's (train/optimizers.py); these ask whether it does for
# EAGLE-1 too, whose head is one decoder layer and an fc like EAGLE-3's (the lm_head is the target's, frozen).
EAGLE_ABLATIONS = {
    "muon": lambda b: {"optimizer": "muon"},  # Muon at 8 x lr, the product's default
    "muon x1": lambda b: {"optimizer": "muon", "muon_lr_scale": 1.0},
    "muon x2": lambda b: {"optimizer": "muon", "muon_lr_scale": 2.0},
    "muon x4": lambda b: {"optimizer": "muon", "muon_lr_scale": 4.0},
    "muon x16": lambda b: {"optimizer": "muon", "muon_lr_scale": 16.0},
    "lr 2e-3": lambda b: {"lr": 2e-3},
    "lr 5e-4": lambda b: {"lr": 5e-4},
    "warmup 0": lambda b: {"warmup_ratio": 0.0, "warmup_steps": 0},
}


EAGLE_CHAT_TARGET_VIEW = (
    chat_target_view("the tied embedding named lm_head.weight in its index, which main.py reads", "ge_data")
    + "; its heads decoded with the rotary base its cnets.py trains with, 10000 (the target's config: 100000)"
)


def eagle_llm_changes(target: str) -> list[str]:
    """What the bench changes of eagle-llm's run: the shims, and on a chat target the view it reads."""
    return list(PEER_CHANGES["eagle-llm"]) + ([EAGLE_CHAT_TARGET_VIEW] if target != "tiny" else [])


def eagle_llm_release_config(config_path: Path) -> dict:
    """The config an eagle-llm 1.2.1 head is read with: main.py's --configpath with the rotary base its
    cnets.py really uses. Its LlamaAttention builds LlamaRotaryEmbedding(head_dim, max_position_embeddings)
    and so base 10000, whatever the config says; SmolLM2's says 100000, and our import reads the config."""
    from specheads.heads.eagle import with_rope_theta

    config = json.loads(config_path.read_text())
    return with_rope_theta(config, EAGLE_LLM_ROPE_THETA)


def add_eagle_llm_rows(lr: float, epochs: list[int], args, ctx: dict) -> None:
    """eagle-llm's main.py at --lr `lr` for its 21 epochs, then a row for its saved state at each of `epochs`,
    each appended to ctx["rows"] as it is measured."""
    import torch
    from trainer_run import eagle_draft_config, finish_trainer, start_trainer

    out, n, rows = args.out, len(ctx["conversations"]), ctx["rows"]
    work = out / f"eagle-llm-lr{lr:g}"
    work.mkdir()
    (work / "ShareGPT_V4.3_unfiltered_cleaned_split.json").write_text(json.dumps(ctx["sharegpt"]))
    (work / "vicunav13").mkdir()
    (work / "vicunav13" / "13B").symlink_to(ctx["peer_target"])
    eagle_draft_config(ctx["peer_target"], work / "config.json")
    torch.save({"features": torch.zeros(1, 4, ctx["hidden"]), "input_ids": torch.zeros(1, 4, dtype=torch.long)},
               work / "inputs.pt")  # fmt: skip
    job = {"kind": "eagle", "work": str(work), "target": str(ctx["peer_target"]), "lr": lr, "bs": EAGLE_BS,
           "inputs": str(work / "inputs.pt"), "out": str(work / "out.pt")}  # fmt: skip
    print(f"eagle-llm lr {lr:g}: training", flush=True)
    proc = start_trainer(ctx["env"], job, work)
    got = finish_trainer(proc.wait(), job, work)
    changes = eagle_llm_changes(args.target)
    if lr != EAGLE_LR:
        changes.insert(0, f"--lr {lr:g} (its default {EAGLE_LR:g}: with its 2000-step warm-up it reaches "
                          "a fraction of that in this budget)")  # fmt: skip
    for e in epochs:
        release = work / f"release-e{e}"
        release.mkdir()
        shutil.copy(work / "ckpt" / f"state_{e - 1}" / "model.safetensors", release / "model.safetensors")
        (release / "config.json").write_text(json.dumps(eagle_llm_release_config(work / "config.json")))
        native = import_heads("eagle", release, ctx["target"], work / f"native-e{e}")
        ev = evaluate(native, args.eagle_tree, work / f"eval-e{e}", args.eval_prompts, args.eval_new_tokens,
                      args.target, ctx["eval_source"], args.device)  # fmt: skip
        full = e == EAGLE_EPOCHS
        rows.append(row_result(
            "EAGLE", f"eagle-llm 1.2.1 (lr {lr:g})", eagle_budget(n, e), ctx["vicuna_tokens"], ev,
            wall=got["wall_s"] if full else None, rss=got["maxrss_kb"] / 1024 if full else None,
            changes=changes, stages_s={"ge_data": got["ge_data_s"], "main": got["main_s"]} if full else None,
        ))  # fmt: skip
        print(f"  {e} epochs: tau {rows[-1]['tau']:.3f} {rows[-1]['identical']}", flush=True)
