"""Compare tiny-target settings at one wall-clock training budget on this machine (JSON out).

For each candidate: time a few training steps, convert the budget to a step count, build it, and
record the held-out loss. Used to choose TinyTargetConfig's defaults and STEPS_PER_MINUTE.

    python benchmarks/tune_tiny_target.py --train-minutes 4.3 --out runs/tune_tiny_target.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specheads.builders.tiny_target import TinyTargetConfig, build

CANDIDATES = {
    "h256-l4-b16": dict(),
    "h192-l4-b16": dict(hidden_size=192, num_heads=3, num_kv_heads=3, intermediate_size=512),
    "h256-l4-b8": dict(batch_size=8, lr=2e-3),
    "h256-l4-v2048": dict(vocab_size=2048),
    "h320-l4-b16": dict(hidden_size=320, num_heads=5, num_kv_heads=5, intermediate_size=864),
    "h192-l6-b16": dict(hidden_size=192, num_heads=3, num_kv_heads=3, intermediate_size=512, num_layers=6),
    "h192-l4-b8": dict(
        hidden_size=192, num_heads=3, num_kv_heads=3, intermediate_size=512, batch_size=8, lr=2e-3
    ),
    "h192-l4-b8-lr3": dict(
        hidden_size=192, num_heads=3, num_kv_heads=3, intermediate_size=512, batch_size=8, lr=3e-3
    ),
    "h128-l4-b8": dict(
        hidden_size=128, num_heads=2, num_kv_heads=2, intermediate_size=352, batch_size=8, lr=3e-3
    ),
}


def seconds_per_step(cfg: TinyTargetConfig, n: int = 4) -> float:
    model = cfg.fresh_model(cfg.vocab_size + 7, 4 * cfg.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len))
    for i in range(n + 1):
        if i == 1:
            t = time.perf_counter()
        loss = F.cross_entropy(model(input_ids=x).logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train-minutes", type=float, default=4.3)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument(
        "--assume",
        nargs="*",
        default=[],
        metavar="NAME=SECONDS",
        help="seconds per step measured earlier on a quiet machine (skips calibrating NAME)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/tune_tiny_target.json"))
    args = p.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    names = [n for n in CANDIDATES if not args.only or n in args.only]
    # Calibrate all candidates first, back to back, so the step times compare like with like; the
    # builds that follow are deterministic in their step count, whatever else the machine does.
    assumed = {k: float(v) for k, v in (a.split("=") for a in args.assume)}
    calibrated = {
        n: assumed[n]
        if n in assumed
        else seconds_per_step(dataclasses.replace(TinyTargetConfig(), **CANDIDATES[n]))
        for n in names
    }
    print(json.dumps({"seconds_per_step": calibrated}), flush=True)
    for name in names:
        overrides = CANDIDATES[name]
        base = dataclasses.replace(TinyTargetConfig(), **overrides)
        sps = calibrated[name]
        steps = int(args.train_minutes * 60 / sps)
        cfg = dataclasses.replace(base, steps=steps, warmup_steps=min(base.warmup_steps, steps // 10))
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            meta = build(cfg, Path(d) / "t", progress=False)
            wall = time.perf_counter() - t
        results[name] = {
            "overrides": overrides,
            "seconds_per_step": sps,
            "steps": steps,
            "parameters": meta["parameters"],
            "heldout_loss": meta["heldout_loss"],
            "build_seconds": wall,
        }
        print(json.dumps({name: results[name]}), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
