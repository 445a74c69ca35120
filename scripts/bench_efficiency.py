"""Decoder efficiency per method on this machine (JSON out, a markdown table beside it).

How close each head's measured speedup comes to what its acceptance allows on this machine's
forward-cost curve, and where the rest of a step goes:

    t(N)             one target tree forward over N new nodes (a chain) after a past of P tokens (P: the
                     mean prompt plus half the new tokens), the fastest of --repeats, for N in --sizes and
                     every tree's size: the machine's cost curve
    ideal speedup    τ · t(1) / t(N): a step verifies N nodes in one forward and emits τ tokens, against one
                     forward per token for generate() (drafting and bookkeeping free)
    measured         tokens/s of the decoder over tokens/s of the target's own generate(), both timed here,
                     interleaved per prompt
    efficiency       measured / ideal
    outside          the share of a decode step (prefill left out) spent outside the tree forward, and each
                     phase's share: draft, tree inputs, verify, compact, the rest

    python scripts/bench_efficiency.py --target tiny --heads runs/q/medusa runs/q/eagle runs/q/eagle3 \\
        --prompts heldout --num-prompts 8 --max-new-tokens 96 --out runs/efficiency.json

Every decoded output is checked token for token against generate() (`identical`). Speed is measured
here, never asserted in tests; the machine is named in the JSON with its load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from specheads.decode.batched_inputs import Layout, batched_tree_inputs
from specheads.decode.decoder import PHASES, SpeculativeDecoder
from specheads.decode.kv_cache import new_cache
from specheads.decode.trees import DraftTree
from specheads.evaluate.baseline import generate_rows
from specheads.evaluate.eval_drafters import drafter_for
from specheads.evaluate.prompts import encode_prompts, read_prompts
from specheads.heads import FrozenTarget, load_heads
from specheads.heads.atomic import write_json, write_text
from specheads.heads.named_targets import resolve_target


@torch.no_grad()
def forward_cost(decoder: SpeculativeDecoder, past: int, sizes: list[int], repeats: int) -> dict[int, float]:
    """t(N) in seconds for each N: the decoder's own tree forward (mask, positions) over a chain of N nodes
    on top of a cache of `past` random tokens, the fastest of `repeats` (interleaved over the sizes)."""
    target = decoder.target
    device = target.device
    vocab = target.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, past), generator=generator).to(device)
    cache = new_cache()
    target(prompt, past_key_values=cache, capture=tuple(decoder.drafter.capture_layers), logits=False)
    layout = Layout.contiguous(past, device=device)
    best = dict.fromkeys(sizes, float("inf"))
    for _ in range(repeats + 1):  # the first round is untimed
        for n in sizes:
            tokens = torch.randint(0, vocab, (1, n), generator=generator).to(device)
            parents = (torch.arange(n, device=device) - 1)[None]  # a chain: node i's parent is i - 1
            tree = DraftTree(tokens=tokens, parents=parents)
            start = time.perf_counter()
            inputs = batched_tree_inputs(tree, layout, past, decoder.mask_dtype, decoder.window)
            decoder.tree_forward(tree, inputs, cache)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            cache.crop(-n)  # back to the past alone
            if _ > 0:
                best[n] = min(best[n], seconds)
    return best


def decode_all(decoder: SpeculativeDecoder, prompts, max_new_tokens: int, warmup: int) -> dict:
    """Decode every prompt with the decoder and with generate(), interleaved; sums and per-phase times."""
    target = decoder.target
    for prompt in prompts[:warmup]:
        decoder.generate(prompt, max_new_tokens)
        generate_rows(target, prompt, max_new_tokens)
    phases = dict.fromkeys(PHASES, 0.0)
    total = base_total = 0.0
    new = base_new = identical = 0
    accept: list[int] = []
    for i, prompt in enumerate(prompts):
        runs = []
        for which in ("method", "baseline") if i % 2 == 0 else ("baseline", "method"):
            start = time.perf_counter()
            out = decoder.generate(prompt, max_new_tokens) if which == "method" else None
            ref = generate_rows(target, prompt, max_new_tokens)[0] if which == "baseline" else None
            runs.append((which, out, ref, time.perf_counter() - start))
        (out, seconds) = next((o, s) for w, o, _, s in runs if w == "method")
        (ref, base_seconds) = next((r, s) for w, _, r, s in runs if w == "baseline")
        for phase in PHASES:
            phases[phase] += out.timings.get(phase, 0.0)
        total += seconds
        base_total += base_seconds
        new += out.tokens.shape[1]
        base_new += len(ref)
        identical += out.tokens[0].tolist() == ref
        accept += out.accept_lengths
    return {
        "tau": sum(accept) / max(len(accept), 1),
        "steps": len(accept),
        "new_tokens": new,
        "seconds": total,
        "tokens_per_second": new / total,
        "baseline_tokens_per_second": base_new / base_total,
        "identical": f"{identical}/{len(prompts)}",
        "phase_seconds": phases,
    }


def head_row(args, target: FrozenTarget, heads_dir: str, tree_name: str | None, prompts, past: int) -> dict:
    heads, config = load_heads(heads_dir, target=target, device=target.device)
    drafter, tree = drafter_for(heads, config, target, tree_name)
    decoder = SpeculativeDecoder(target, drafter)
    nodes = int(tree["nodes"])
    costs = forward_cost(decoder, past, sorted({1, nodes, *args.sizes}), args.repeats)
    run = decode_all(decoder, prompts, args.max_new_tokens, args.warmup)
    ideal = run["tau"] * costs[1] / costs[nodes]
    measured = run["tokens_per_second"] / run["baseline_tokens_per_second"]
    steps_seconds = run["seconds"] - run["phase_seconds"]["prefill"]  # the decode steps, prefill left out
    phases = {p: s for p, s in run["phase_seconds"].items() if p != "prefill"}
    phases["rest"] = max(steps_seconds - sum(phases.values()), 0.0)
    return {
        "heads": heads_dir,
        "method": config["method"],
        "tree": tree,
        "tau": run["tau"],
        "identical_to_generate": run["identical"],
        "tokens_per_second": run["tokens_per_second"],
        "generate_tokens_per_second": run["baseline_tokens_per_second"],
        "measured_speedup": measured,
        "ideal_speedup": ideal,
        "efficiency": measured / ideal,
        "forward_cost_seconds": {str(n): s for n, s in costs.items()},
        "step_seconds": steps_seconds / max(run["steps"], 1),
        "outside_forward_fraction": 1 - phases["tree_forward"] / max(steps_seconds, 1e-12),
        "phase_fraction": {p: s / max(steps_seconds, 1e-12) for p, s in phases.items()},
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| heads | tree (nodes) | τ | t(N)/t(1) | ideal | measured | efficiency | outside forward | draft | "
        "identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        n = str(r["tree"]["nodes"])
        ratio = r["forward_cost_seconds"][n] / r["forward_cost_seconds"]["1"]
        lines.append(
            f"| {r['method']} | {r['tree']['name']} ({n}) | {r['tau']:.2f} | {ratio:.2f} | "
            f"{r['ideal_speedup']:.2f}x | {r['measured_speedup']:.2f}x | {r['efficiency']:.2f} | "
            f"{r['outside_forward_fraction']:.0%} | {r['phase_fraction']['draft']:.0%} | "
            f"{r['identical_to_generate']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HF directory, hub id, or a named target (tiny, smollm2)")
    p.add_argument("--heads", nargs="+", required=True, help="native head checkpoints")
    p.add_argument("--tree", nargs="*", default=None, help="one tree name for all heads, or one each")
    p.add_argument("--prompts", default="heldout", help="as `specheads eval --prompts`")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--sizes", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, required=True, help="JSON file (a .md table is written beside it)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    trees = args.tree or [None]
    if len(trees) not in (1, len(args.heads)):
        p.error("--tree takes one name for all heads or one each")
    trees = trees * len(args.heads) if len(trees) == 1 else trees

    path = resolve_target(args.target)
    target = FrozenTarget.from_pretrained(path, dtype=args.dtype)
    target.model.to(args.device)
    texts = read_prompts(args.prompts, path, num_prompts=args.num_prompts)
    prompts, _ = encode_prompts(texts, target.tokenizer, True, args.prompt_tokens)
    prompts = [q.input_ids.to(target.device) for q in prompts]
    past = int(statistics.mean(q.shape[1] for q in prompts)) + args.max_new_tokens // 2
    load = os.getloadavg()[0]
    rows = [head_row(args, target, h, t, prompts, past) for h, t in zip(args.heads, trees)]
    result = {
        "target": str(args.target),
        "prompts": f"{args.prompts} ({len(prompts)})",
        "max_new_tokens": args.max_new_tokens,
        "past_tokens_for_t(N)": past,
        "heads": rows,
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": args.device,
            "dtype": args.dtype,
            "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)],  # before, after
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    write_text(args.out.with_suffix(".md"), table(rows))
    print(table(rows), end="")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
