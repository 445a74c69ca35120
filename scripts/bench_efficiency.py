"""Decoder efficiency per method on this machine (JSON out, a markdown table beside it).

How close each head's measured speedup comes to what its acceptance allows on this machine's
forward-cost curve, and where the rest of a step goes:

    t(N)             one target tree forward over N new nodes (a chain, its mask and positions built before
                     the clock starts, as the decoder's tree-inputs phase builds them) after a past of P
                     tokens (P: the mean prompt plus half the new tokens), for N in --sizes and every tree's
                     size: the machine's cost curve, its mean over sweeps made after every prompt
                     (--repeats each), so it sees the load the decodes saw (the fastest sweep is in the
                     JSON too)
    ideal speedup    τ · t(1) / t(N): a step verifies N nodes in one forward and emits τ tokens, against one
                     forward per token for generate() (drafting and bookkeeping free)
    measured         tokens/s of the decoder over tokens/s of the target's own generate(), all timed in
                     one run: each prompt is decoded by generate() once and by every head, in an order
                     that rotates from prompt to prompt, then t(N) is swept; every head is set against
                     the same baseline and the same curve
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
import functools
import os
import statistics
import time
from pathlib import Path

import torch

from specheads.builders.named_targets import resolve_target
from specheads.core.atomic import write_json, write_text
from specheads.core.machine import processor_name
from specheads.core.target import FrozenTarget
from specheads.decode.baseline import generate_rows
from specheads.decode.batched_inputs import Layout, batched_tree_inputs
from specheads.decode.decoder import PHASES, SpeculativeDecoder
from specheads.decode.drafter_factory import drafter_for
from specheads.decode.kv_cache import new_cache
from specheads.decode.step import decoding_attention, timed
from specheads.decode.trees import DraftTree
from specheads.evaluate.peers import adapted_target
from specheads.evaluate.prompts import encode_prompts, read_prompts
from specheads.evaluate.report import phase_shares
from specheads.heads import load_heads
from specheads.heads.checkpoint import draft_vocab_ids
from specheads.methods import methods


class CostCurve:
    """t(N): the decoder's own tree forward (mask, positions) over a chain of N nodes on top of a cache of
    `past` random tokens. Each `sweep` times every size once, in a rotating order; the bench sweeps once
    per prompt, between the decodes, so the curve sees the same load as the speedups it is set against."""

    def __init__(self, decoder: SpeculativeDecoder, past: int, sizes: list[int]):
        self.decoder, self.past, self.sizes = decoder, past, sorted(set(sizes))
        target = decoder.target
        self.generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, target.vocab_size, (1, past), generator=self.generator).to(target.device)
        self.cache = new_cache()
        self.capture = tuple(decoder.drafter.capture_layers)
        target(prompt, past_key_values=self.cache, capture=self.capture, logits=False)
        self.layout = Layout.contiguous(past, device=target.device)
        self.samples: dict[int, list[float]] = {n: [] for n in self.sizes}

    @torch.no_grad()
    def sweep(self, round_index: int, record: bool = True) -> None:
        decoder = self.decoder
        device = decoder.target.device
        shift = round_index % len(self.sizes)
        for n in self.sizes[shift:] + self.sizes[:shift]:
            tokens = torch.randint(0, decoder.target.vocab_size, (1, n), generator=self.generator).to(device)
            parents = (torch.arange(n, device=device) - 1)[None]  # a chain: node i's parent is i - 1
            tree = DraftTree(tokens=tokens, parents=parents)
            # the tree's structure and inputs are the decoder's draft and tree-inputs phases, not the
            # forward: built before the clock (a static tree's are cached; timing them here once made
            # t(64) 15-60% dearer than the decoder's own tree forward, and efficiencies above 1)
            inputs = batched_tree_inputs(tree, self.layout, self.past, decoder.mask_dtype, decoder.window)
            _, seconds = timed(functools.partial(decoder.tree_forward, tree, inputs, self.cache), device)
            self.cache.crop(-n)  # back to the past alone
            if record:
                self.samples[n].append(seconds)

    def mean(self) -> dict[int, float]:
        return {n: statistics.fmean(s) for n, s in self.samples.items()}

    def fastest(self) -> dict[int, float]:
        return {n: min(s) for n, s in self.samples.items()}


def new_totals() -> dict:
    return {"seconds": 0.0, "new": 0, "identical": 0, "accept": [], "phases": dict.fromkeys(PHASES, 0.0)}


def decode_interleaved(decoders: list[SpeculativeDecoder], curve: CostCurve, prompts, args):
    """Every prompt: generate() once, then each head, in an order that rotates from prompt to prompt, then
    `--repeats` sweeps of t(N). Every head is timed against the same baseline runs and the same curve."""
    target = decoders[0].target
    for prompt in prompts[: args.warmup]:  # untimed
        generate_rows(target, prompt, args.max_new_tokens)
        for decoder in decoders:
            decoder.generate(prompt, args.max_new_tokens)
        curve.sweep(0, record=False)
    heads = [new_totals() for _ in decoders]
    base = {"seconds": 0.0, "new": 0}
    runners = ["baseline", *range(len(decoders))]
    for i, prompt in enumerate(prompts):
        shift = i % len(runners)
        ref = None
        outs = {}
        for who in runners[shift:] + runners[:shift]:
            start = time.perf_counter()
            if who == "baseline":
                ref = generate_rows(target, prompt, args.max_new_tokens)[0]
                base["seconds"] += time.perf_counter() - start
                base["new"] += len(ref)
            else:
                outs[who] = decoders[who].generate(prompt, args.max_new_tokens)
                heads[who]["seconds"] += time.perf_counter() - start
        for r in range(args.repeats):
            curve.sweep(i * args.repeats + r)
        for who, out in outs.items():
            h = heads[who]
            h["new"] += out.tokens.shape[1]
            h["identical"] += out.tokens[0].tolist() == ref
            h["accept"] += out.accept_lengths
            for phase in PHASES:
                h["phases"][phase] += out.timings.get(phase, 0.0)
    return heads, base


def head_row(heads_dir: str, config: dict, tree: dict, run: dict, base: dict, curve: CostCurve, prompts: int):
    nodes = int(tree["nodes"])
    costs = curve.mean()
    tau = sum(run["accept"]) / max(len(run["accept"]), 1)
    ideal = tau * costs[1] / costs[nodes]
    measured = (run["new"] / run["seconds"]) / (base["new"] / base["seconds"])
    steps_seconds = run["seconds"] - run["phases"]["prefill"]  # the decode steps, prefill left out
    shares = phase_shares(run["phases"], run["seconds"])
    return {
        "heads": heads_dir,
        "method": config["method"],
        "tree": tree,
        "tau": tau,
        "identical_to_generate": f"{run['identical']}/{prompts}",
        "tokens_per_second": run["new"] / run["seconds"],
        "generate_tokens_per_second": base["new"] / base["seconds"],
        "measured_speedup": measured,
        "ideal_speedup": ideal,
        "efficiency": measured / ideal,
        "forward_cost_seconds": {str(n): s for n, s in costs.items()},
        "forward_cost_fastest_seconds": {str(n): s for n, s in curve.fastest().items()},
        "forward_cost_sweeps": len(curve.samples[1]),
        "step_seconds": steps_seconds / max(len(run["accept"]), 1),
        "outside_forward_fraction": shares["outside_forward_fraction"],
        "phase_fraction": shares["step_phase_fraction"],
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
        vocab = r["tree"].get("draft_vocab")
        lines.append(
            f"| {r['method']}{f' (draft vocabulary {vocab})' if vocab else ''} | {r['tree']['name']} ({n}) | {r['tau']:.2f} | {ratio:.2f} | "
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
    p.add_argument(
        "--draft-vocab",
        type=int,
        nargs="*",
        default=None,
        help="as `specheads eval --draft-vocab`, one for all heads or one each (0: the whole vocabulary), so "
        "one heads folder can be timed both ways in one run",
    )
    p.add_argument("--prompts", default="heldout", help="as `specheads eval --prompts`")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--sizes", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--repeats", type=int, default=1, help="t(N) sweeps after each prompt")
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
    vocabs = args.draft_vocab or [0]
    if len(vocabs) not in (1, len(args.heads)) or min(vocabs) < 0:
        p.error("--draft-vocab takes one count >= 0 for all heads or one each")
    vocabs = vocabs * len(args.heads) if len(vocabs) == 1 else vocabs

    path = resolve_target(args.target)
    target = FrozenTarget.from_pretrained(path, dtype=args.dtype)
    target = adapted_target(target, args.heads)  # Medusa-2 heads: their adapted target, timed alone
    target.model.to(args.device)
    texts = read_prompts(args.prompts, path, num_prompts=args.num_prompts)
    prompts, _ = encode_prompts(texts, target.tokenizer, True, args.prompt_tokens)
    prompts = [q.input_ids.to(target.device) for q in prompts]
    past = int(statistics.mean(q.shape[1] for q in prompts)) + args.max_new_tokens // 2
    load = os.getloadavg()[0]
    loaded = []
    for heads_dir, tree_name, size in zip(args.heads, trees, vocabs):
        heads, config = load_heads(
            heads_dir, target=target, device=target.device, dtype=target.dtype, methods=methods()
        )
        vocab = draft_vocab_ids(heads_dir, size, target.vocab_size) if size else None
        drafter, tree = drafter_for(heads, config, target, tree_name, vocab, methods=methods())
        tree = {**tree, "draft_vocab": size or None}
        loaded.append((heads_dir, config, tree, SpeculativeDecoder(target, drafter)))
    decoders = [d for *_, d in loaded]
    sizes = [1, *args.sizes, *(int(tree["nodes"]) for _, _, tree, _ in loaded)]
    # the curve's forwards and the baseline with the decoders' attention backends (decode/step.py)
    with decoding_attention(target.device):
        curve = CostCurve(max(decoders, key=lambda d: len(d.drafter.capture_layers)), past, sizes)
        runs, base = decode_interleaved(decoders, curve, prompts, args)
    rows = [head_row(h, c, t, run, base, curve, len(prompts)) for (h, c, t, _), run in zip(loaded, runs)]
    result = {
        "target": str(args.target),
        "prompts": f"{args.prompts} ({len(prompts)})",
        "max_new_tokens": args.max_new_tokens,
        "past_tokens_for_t(N)": past,
        "heads": rows,
        "machine": {
            "processor": processor_name(),
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
