"""Throughput of batched speculative decoding against the target's own batched `generate()` (JSON out).

For each batch size B (default 1, 4 and 8) the same held-out prompts are decoded in consecutive groups
of B, left-padded, by `BatchedSpeculativeDecoder` with the given heads and by the target's own
`generate(do_sample=False)`; which of the two goes first alternates from group to group. Both are timed
end to end (prefill included). Per batch size it reports tokens/s of both (new tokens up to each row's
EOS / wall seconds), the speedup, τ (mean accept length over every row's steps, bonus included), the
batched steps, where the decoder's time goes, and how many rows equal the baseline token for token.

    python scripts/bench_batched.py --heads runs/quickstart/medusa --batch-sizes 1 4 8 \\
        --num-prompts 8 --max-new-tokens 128 --out runs/bench_batched.json

--target defaults to the embedded tiny target (built and cached by `specheads tiny-target` on first
use); --heads to runs/quickstart/medusa (written by `specheads quickstart`); --prompts to the target's
held-out files. Any head checkpoint `specheads eval` takes works (Medusa, EAGLE, EAGLE-3), with the same
default trees. Speed is measured here, never asserted in tests; a busy machine makes it noisy.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from specheads.cli.eval_flags import add_tree_argument
from specheads.core.target import FrozenTarget
from specheads.decode.baseline import generate_rows, pad_token_id
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import left_pad
from specheads.decode.decoder import PHASES
from specheads.decode.drafter_factory import drafter_for
from specheads.decode.step import timed
from specheads.evaluate.prompts import encode_prompts, read_prompts
from specheads.heads import load_heads
from specheads.methods import methods

DEFAULT_HEADS = Path("runs/quickstart/medusa")


def baseline(target: FrozenTarget, ids, mask, max_new_tokens: int) -> tuple[list[list[int]], float]:
    """The target's own batched greedy `generate`: each row's new tokens up to its EOS, and the wall seconds."""
    return timed(lambda: generate_rows(target, ids, max_new_tokens, mask), target.device)


def speculative(decoder: BatchedSpeculativeDecoder, ids, mask, max_new_tokens: int):
    return timed(lambda: decoder.generate(ids, mask, max_new_tokens, profile=True), decoder.target.device)


def bench_batch_size(decoder, prompts, batch_size: int, args, pad_id: int) -> dict:
    """Decode `prompts` in groups of `batch_size` both ways; the figures for this batch size."""
    target = decoder.target
    groups = [left_pad(prompts[i : i + batch_size], pad_id) for i in range(0, len(prompts), batch_size)]
    for _ in range(args.warmup):  # the first calls at a new shape pay for allocation
        decoder.generate(*groups[0], 8)
        baseline(target, *groups[0], 8)
    totals = dict(
        new_tokens=0, seconds=0.0, baseline_new_tokens=0, baseline_seconds=0.0, identical=0, steps=0
    )
    phases = dict.fromkeys(PHASES, 0.0)
    accept_lengths: list[int] = []
    for g, (ids, mask) in enumerate(groups):
        ids, mask = ids.to(target.device), mask.to(target.device)
        if g % 2 == 0:
            out, seconds = speculative(decoder, ids, mask, args.max_new_tokens)
            reference, baseline_seconds = baseline(target, ids, mask, args.max_new_tokens)
        else:
            reference, baseline_seconds = baseline(target, ids, mask, args.max_new_tokens)
            out, seconds = speculative(decoder, ids, mask, args.max_new_tokens)
        rows = [row.tokens[0].tolist() for row in out.rows]
        totals["new_tokens"] += sum(len(r) for r in rows)
        totals["seconds"] += seconds
        totals["baseline_new_tokens"] += sum(len(r) for r in reference)
        totals["baseline_seconds"] += baseline_seconds
        totals["identical"] += sum(a == b for a, b in zip(rows, reference))
        totals["steps"] += out.steps
        accept_lengths += [n for row in out.rows for n in row.accept_lengths]
        for phase in PHASES:
            phases[phase] += out.timings[phase]
    tokens_per_second = totals["new_tokens"] / totals["seconds"]
    baseline_tokens_per_second = totals["baseline_new_tokens"] / totals["baseline_seconds"]
    phases["overhead"] = totals["seconds"] - sum(phases.values())
    return {
        "batch_size": batch_size,
        "groups": len(groups),
        "tokens_per_second": tokens_per_second,
        "baseline_tokens_per_second": baseline_tokens_per_second,
        "speedup": tokens_per_second / baseline_tokens_per_second,
        "mean_accept_length": sum(accept_lengths) / len(accept_lengths) if accept_lengths else None,
        "new_tokens": totals["new_tokens"],
        "baseline_new_tokens": totals["baseline_new_tokens"],
        "seconds": totals["seconds"],
        "baseline_seconds": totals["baseline_seconds"],
        "steps": totals["steps"],
        "identical_to_baseline": f"{totals['identical']} of {len(prompts)}",
        "phase_seconds": phases,
    }


def resolve_paths(args) -> tuple[str, str]:
    """--target (default: the embedded tiny target, built on first use) and --heads (default: the quickstart's)."""
    heads = args.heads or (str(DEFAULT_HEADS) if DEFAULT_HEADS.is_dir() else None)
    if heads is None:
        sys.exit(
            f"no --heads given and {DEFAULT_HEADS} does not exist: train heads first (`specheads quickstart`)"
        )
    if args.target:
        return args.target, heads
    from specheads.builders.tiny_target import ensure_tiny_target

    print("--target not given: using the embedded tiny target (building it on first use)", file=sys.stderr)
    path, _, _ = ensure_tiny_target(progress=False)
    return str(path), heads


def bench(args) -> dict:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target_path, heads_path = resolve_paths(args)
    target = FrozenTarget.from_pretrained(target_path, dtype=args.dtype, attn_implementation=args.attn)
    target.model.to(args.device)
    heads, head_config = load_heads(
        heads_path, target, device=target.device, dtype=target.dtype, methods=methods()
    )
    drafter, tree = drafter_for(heads, head_config, target, args.tree, methods=methods())
    decoder = BatchedSpeculativeDecoder(target, drafter)
    texts = read_prompts(args.prompts, target_path, num_prompts=args.num_prompts)
    prompts, templated = encode_prompts(texts, target.tokenizer, True, args.prompt_tokens)
    prompts = [p.input_ids for p in prompts]
    pad_id = pad_token_id(target)

    by_size = [bench_batch_size(decoder, prompts, b, args, pad_id) for b in args.batch_sizes]
    first = by_size[0]
    for row in by_size:  # throughput against the first batch size (1 by default), both ways
        row["scaling"] = row["tokens_per_second"] / first["tokens_per_second"]
        row["baseline_scaling"] = row["baseline_tokens_per_second"] / first["baseline_tokens_per_second"]
    return {
        "method": head_config["method"],
        "target": target_path,
        "heads": heads_path,
        "tree": {k: v for k, v in tree.items() if k != "choices"},
        "prompts": {"source": args.prompts, "count": len(prompts), "chat_template": templated},
        "prompt_tokens": [p.shape[1] for p in prompts],
        "max_new_tokens": args.max_new_tokens,
        "by_batch_size": by_size,
        "machine": {
            "device": str(target.device),
            "dtype": str(target.dtype),
            "attn": args.attn,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="HF directory of the target (default: the embedded tiny target)")
    p.add_argument("--heads", help=f"native head checkpoint directory (default: {DEFAULT_HEADS})")
    p.add_argument(
        "--prompts", default="heldout", help="`heldout`, a .jsonl of questions or a .json file list"
    )
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64, help="tokens taken from the start of each file")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    add_tree_argument(p)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's own)")
    p.add_argument("--warmup", type=int, default=1, help="untimed decodes per batch size before measuring")
    p.add_argument("--out", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    if min(args.batch_sizes) < 1 or args.max_new_tokens < 1 or args.num_prompts < 1:
        p.error("--batch-sizes, --max-new-tokens and --num-prompts must be >= 1")
    result = json.dumps(bench(args), indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(result + "\n")
    else:
        print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
