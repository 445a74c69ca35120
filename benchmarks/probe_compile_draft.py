"""Does `torch.compile` speed up one EAGLE draft level on this machine? (JSON out)

One draft level of the tiny target's head, as `decode/draft_layer.py` runs it (the fused q/k/v projection,
rope, the cache's keys and values appended, SDPA under a mask, the output projection, RMSNorm, the gated
MLP), then the projection onto a draft vocabulary, its log-softmax and top-k: eager against
`torch.compile` (inductor, static shapes), timed alternately after a warm-up, on random weights of the
head's shapes. Shapes default to the tiny target's (hidden 128, 2 heads of 64, MLP 352) with 8 nodes over
300 cached positions.

    OMP_NUM_THREADS=1 python benchmarks/probe_compile_draft.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch.nn import functional as F

from specheads.core.machine import processor_name


def level_fn(hidden: int, heads: int, head_dim: int, mlp: int, nodes: int, past: int, vocab: int):
    g = torch.Generator().manual_seed(0)

    def weight(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    qkv, o = weight(hidden, 3 * heads * head_dim), weight(heads * head_dim, hidden)
    gate_up, down, lm = weight(hidden, 2 * mlp), weight(mlp, hidden), weight(hidden, vocab)
    norm = torch.ones(hidden)
    cos, sin = torch.randn(1, 1, nodes, head_dim), torch.randn(1, 1, nodes, head_dim)
    mask = torch.zeros(1, 1, nodes, past + nodes)

    def rotate(x):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def level(residual, attn_input, keys, values):
        b = attn_input.shape[0]
        split = (attn_input @ qkv).view(b, nodes, -1, head_dim).transpose(1, 2)
        rotary, v = split.split([2 * heads, heads], 1)
        q, k = rotate(rotary).split([heads, heads], 1)
        k, v = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = residual + attended.transpose(1, 2).reshape(b, nodes, -1) @ o
        gate, up = (F.rms_norm(h, (hidden,), norm, 1e-6) @ gate_up).chunk(2, -1)
        out = h + (F.silu(gate) * up) @ down
        return out, (out @ lm).log_softmax(-1).topk(8, -1)

    inputs = (
        torch.randn(1, nodes, hidden),
        torch.randn(1, nodes, hidden),
        torch.randn(1, heads, past, head_dim),
        torch.randn(1, heads, past, head_dim),
    )
    return level, inputs


def microseconds(fn, inputs, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp", type=int, default=352)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--past", type=int, default=300)
    p.add_argument("--vocab", type=int, default=1024, help="the draft vocabulary projected onto")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    level, inputs = level_fn(
        args.hidden, args.heads, args.head_dim, args.mlp, args.nodes, args.past, args.vocab
    )
    with torch.no_grad():
        start = time.perf_counter()
        compiled = torch.compile(level, dynamic=False)
        compiled(*inputs)
        compile_seconds = time.perf_counter() - start
        for fn in (level, compiled):
            microseconds(fn, inputs, 100)
        eager, fused = [], []
        for _ in range(args.rounds):  # alternated, so a change in load touches both
            eager.append(microseconds(level, inputs, args.calls))
            fused.append(microseconds(compiled, inputs, args.calls))
    result = {
        "settings": vars(args),
        "eager_us": eager,
        "compiled_us": fused,
        "compiled_over_eager_best": min(fused) / min(eager),
        "compile_seconds": compile_seconds,
        "machine": {
            "processor": processor_name(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "load_average": os.getloadavg(),
        },
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        json.dumps(
            {k: result[k] for k in ("eager_us", "compiled_us", "compiled_over_eager_best", "compile_seconds")}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
