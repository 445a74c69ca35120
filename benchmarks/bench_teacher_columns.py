"""What the EAGLE-3 loss's teacher costs, op by op, at a target's shapes, JSON out.

    python benchmarks/bench_teacher_columns.py --threads 1 --out runs/bench-teacher-columns.json

The loss reads the target's logits (B, T, V) twice: their argmax over the whole vocabulary, and their
columns of the draft vocabulary (Vd ids) as the teacher (train/eagle_losses.py). It times, on random
tensors of SmolLM2-135M's sizes by default (hidden 576, vocab 49,152, a draft vocabulary of 8,192, a batch
of 8 rows of 320 tokens):

- `index_select`: logits.index_select(-1, ids), what the loss ran before 2026-12-06;
- `indexing`: logits[..., ids], the same gather, what it runs now (checked equal to the last bit);
- `full_product`, `argmax`: lm_head over every row of its weight, and the argmax: what a held-out
  evaluation ran on the target's kept states before 2026-12-06, with one of the gathers;
- `columns_product`: the draft vocabulary's rows of the lm_head alone (train/held_out.py's
  `logit_columns`), what a later held-out evaluation runs now, the argmax kept from the first one;
  `columns_equal` says whether it equals the full product's columns to the last bit on this machine.

Each time is the median of `--repeats` runs after one warm-up. Times are noisy on a shared machine: read
the load average, and compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specheads.core.atomic import write_json


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=320, help="tokens a row (the batch's padded length)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: print)")
    args = p.parse_args(argv)
    if not 0 < args.draft_vocab <= args.vocab:
        p.error(f"--draft-vocab must be in 1..--vocab ({args.vocab}), got {args.draft_vocab}")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=generator) * 0.05
    hidden = torch.randn(args.batch, args.tokens, args.hidden, generator=generator)
    ids = torch.randperm(args.vocab, generator=generator)[: args.draft_vocab].sort().values
    logits = F.linear(hidden, weight)

    times = {
        "index_select": median_seconds(lambda: logits.index_select(-1, ids), args.repeats),
        "indexing": median_seconds(lambda: logits[..., ids], args.repeats),
        "full_product": median_seconds(lambda: F.linear(hidden, weight), args.repeats),
        "argmax": median_seconds(lambda: logits.argmax(-1), args.repeats),
        "columns_product": median_seconds(lambda: F.linear(hidden, weight[ids]), args.repeats),
    }
    kept_before = times["full_product"] + times["argmax"] + times["index_select"]
    result = {
        "shapes": {k: getattr(args, k) for k in ("hidden", "vocab", "draft_vocab", "batch", "tokens")},
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "seconds": {k: round(v, 5) for k, v in times.items()},
        "gather_equal": torch.equal(logits.index_select(-1, ids), logits[..., ids]),
        "columns_equal": torch.equal(logits[..., ids], F.linear(hidden, weight[ids])),
        "indexing_speedup": times["index_select"] / times["indexing"],
        # a kept held-out batch: lm_head, argmax and index_select before; the columns' product now
        "kept_batch_seconds": {"before": round(kept_before, 5), "now": round(times["columns_product"], 5)},
        "kept_batch_speedup": kept_before / times["columns_product"],
        "load_average_at_end": os.getloadavg(),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, result, indent=2)  # whole or not at all
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
