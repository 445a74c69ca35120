"""Muon's step on an EAGLE-3 head of SmolLM2-135M's shape, per Newton-Schulz dtype, JSON out.

    python benchmarks/bench_muon.py --out runs/bench-muon.json [--threads 1] [--steps 10]

Times MuonWithAdamW.step (train/optimizers.py: torch's Muon on the head's hidden matrices, AdamW on the rest)
over random gradients, with muon_dtype float32 and bfloat16, after two untimed steps. The head is an Eagle3Head
of SmolLM2-135M-Instruct's layer (hidden 576, intermediate 1536, 9 heads / 3 KV heads of 64, vocabulary
49,152, a draft vocabulary of 8,192: recipes/smollm2-135m/eagle3.yaml), built without the target. The step's
cost does not depend on the batch, so at small batches it is a larger share of a training step. The file says
what muon_dtype "auto" picks on this machine (`cpu_multiplies_bf16`) and the load average, since the machine
may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from specheads.core.machine import processor_name
from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
from specheads.train.optimizers import build_optimizer, cpu_multiplies_bf16, newton_schulz_dtype

SMOLLM2_LAYER = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
}  # fmt: skip


def step_seconds(dtype: str, steps: int, seed: int = 0) -> float:
    """Mean seconds of one optimizer step over `steps` timed steps (two untimed first)."""
    torch.manual_seed(seed)
    head = Eagle3Head(
        Eagle3Config(layer_config=SMOLLM2_LAYER, draft_vocab_size=8192, target_layers=(2, 15, 27))
    )
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = build_optimizer(head, "muon", 2e-3, (0.9, 0.999), 0.0, muon_lr_scale=8.0, muon_dtype=dtype)
    times = []
    for i in range(steps + 2):
        for p in params:
            p.grad = torch.randn_like(p)
        started = time.perf_counter()
        optimizer.step()
        if i >= 2:
            times.append(time.perf_counter() - started)
    return sum(times) / len(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    seconds = {dtype: step_seconds(dtype, args.steps) for dtype in ("float32", "bfloat16")}
    result = {
        "step_seconds": seconds,
        "bfloat16_speedup": seconds["float32"] / seconds["bfloat16"],
        "auto_picks": str(newton_schulz_dtype(torch.device("cpu"))).removeprefix("torch."),
        "cpu_bf16_instructions": cpu_multiplies_bf16(),
        "threads": args.threads,
        "steps": args.steps,
        "load_average": os.getloadavg(),
        "platform": platform.platform(),
        "processor": processor_name(),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
