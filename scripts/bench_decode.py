"""Benchmark the speculative decoder against plain greedy decoding on one machine (JSON out).

For each held-out prompt: the target's own `generate(do_sample=False)` (the baseline), a plain
decoding loop (to time one ordinary decode step), and the speculative decoder with the given heads.
Reports τ (mean accept length, bonus token included), per-depth acceptance, the decoder's time per
step against one plain decode step, the speedup in tokens/s over `generate`, how many outputs equal
the baseline token for token, and where the decoder's time goes (draft, tree inputs, tree forward,
verify, compaction, overhead).

    python scripts/bench_decode.py --target runs/target --heads runs/medusa --tree medusa-63 \\
        --num-prompts 8 --max-new-tokens 128 --out runs/bench_decode.json

Prompts come from --prompts (a text file, one prompt per line, or JSONL with a "prompt" field) or,
for the embedded tiny target, from the held-out files recorded beside it (heldout_files.json).
Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

from specheads.builders.tiny_target import HELDOUT_FILE
from specheads.core.target import FrozenTarget
from specheads.decode import DEFAULT_TREES, MedusaDrafter, SpeculativeDecoder, StaticTree, default_tree
from specheads.decode.baseline import generate_rows
from specheads.decode.decoder import PHASES
from specheads.decode.kv_cache import new_cache
from specheads.decode.step import timed
from specheads.heads import load_heads
from specheads.methods import methods


def load_prompts(args, tokenizer) -> list[torch.Tensor]:
    """(1, T) prompts, at most --prompt-tokens long each."""
    if args.prompts:
        lines = [line for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        texts = [json.loads(line)["prompt"] if line.lstrip().startswith("{") else line for line in lines]
    else:
        heldout = Path(args.target) / HELDOUT_FILE
        if not heldout.is_file():
            sys.exit(f"no --prompts given and {args.target} has no {HELDOUT_FILE} to take prompts from")
        record = json.loads(heldout.read_text())
        root = heldout.parent / record.get("root", record.get("stdlib", "."))
        texts = [(root / f).read_text(encoding="utf-8", errors="replace") for f in record["files"]]
    texts = [t for t in texts if t.strip()][: args.num_prompts]
    return [tokenizer(t, return_tensors="pt")["input_ids"][:, : args.prompt_tokens] for t in texts]


def choose_tree(args, num_heads: int) -> StaticTree:
    if args.tree_choices:
        source = Path(args.tree_choices)
        choices = json.loads(source.read_text() if source.is_file() else args.tree_choices)
        return StaticTree.from_choices(choices, num_heads=num_heads)
    return default_tree(args.tree, num_heads=num_heads)


@torch.no_grad()
def plain_decode(target: FrozenTarget, prompt: torch.Tensor, n: int) -> tuple[list[int], float, float]:
    """Greedy decoding one token per forward; returns (tokens, prefill seconds, seconds per decode step)."""
    cache = new_cache()
    token, prefill = timed(
        lambda: target(prompt, past_key_values=cache).logits[:, -1:].argmax(-1), target.device
    )
    tokens = [int(token)]

    def rest() -> None:
        nonlocal token
        for _ in range(n - 1):
            token = target(token, past_key_values=cache).logits[:, -1:].argmax(-1)
            tokens.append(int(token))

    _, seconds = timed(rest, target.device)
    return tokens, prefill, seconds / max(1, n - 1)


def baseline_generate(target: FrozenTarget, prompt: torch.Tensor, n: int) -> tuple[list[int], float]:
    """The target's own greedy `generate` (decode.baseline): the new tokens up to EOS, and the wall seconds."""
    rows, seconds = timed(lambda: generate_rows(target, prompt, n), target.device)
    return rows[0], seconds


def bench(args) -> dict:
    target = FrozenTarget.from_pretrained(args.target, dtype=args.dtype, attn_implementation=args.attn)
    target.model.to(args.device)
    heads, head_config = load_heads(
        args.heads, target=target, device=target.device, dtype=target.dtype, methods=methods()
    )
    if head_config["method"] != "medusa":
        sys.exit(f"only Medusa heads have a drafter so far; {args.heads} holds {head_config['method']!r}")
    tree = choose_tree(args, heads.num_heads)
    lm_head = target.lm_head if heads.config.share_lm_head else None
    decoder = SpeculativeDecoder(target, MedusaDrafter(heads, tree, lm_head=lm_head))
    prompts = [p.to(target.device) for p in load_prompts(args, target.tokenizer)]
    if not prompts:
        sys.exit("no prompts")

    for _ in range(args.warmup):  # first calls pay for allocation and kernel selection
        decoder.generate(prompts[0], 8)
        baseline_generate(target, prompts[0], 8)

    rows, accept_lengths = [], []
    phase_seconds = dict.fromkeys([*PHASES, "total"], 0.0)
    for prompt in prompts:
        reference, generate_seconds = baseline_generate(target, prompt, args.max_new_tokens)
        _, _, plain_step = plain_decode(target, prompt, args.max_new_tokens)
        out = decoder.generate(prompt, args.max_new_tokens, profile=True)
        accept_lengths += out.accept_lengths
        for phase, seconds in out.timings.items():
            phase_seconds[phase] += seconds
        decode_seconds = out.timings["total"]
        rows.append(
            {
                "prompt_tokens": prompt.shape[1],
                "new_tokens": out.tokens.shape[1],
                "steps": out.steps,
                "mean_accept_length": out.mean_accept_length,
                "identical_to_baseline": out.tokens[0].tolist() == reference,
                "seconds": decode_seconds,
                "baseline_new_tokens": len(reference),
                "baseline_seconds": generate_seconds,
                "step_seconds": (decode_seconds - out.timings.get("prefill", 0.0)) / max(1, out.steps),
                "plain_step_seconds": plain_step,
            }
        )

    new_tokens = sum(r["new_tokens"] for r in rows)
    decode_seconds = phase_seconds["total"]
    tokens_per_second = new_tokens / decode_seconds
    baseline_tokens_per_second = sum(r["baseline_new_tokens"] for r in rows) / sum(
        r["baseline_seconds"] for r in rows
    )
    step_seconds = statistics.mean(r["step_seconds"] for r in rows)
    plain_step_seconds = statistics.mean(r["plain_step_seconds"] for r in rows)
    breakdown = {phase: phase_seconds[phase] for phase in PHASES}
    breakdown["overhead"] = decode_seconds - sum(breakdown.values())
    return {
        "method": "medusa",
        "target": str(args.target),
        "heads": str(args.heads),
        "tree": {
            "name": None if args.tree_choices else args.tree,
            "nodes": tree.num_nodes,
            "depth": tree.max_depth,
        },
        "prompts": len(rows),
        "max_new_tokens": args.max_new_tokens,
        "mean_accept_length": sum(accept_lengths) / max(1, len(accept_lengths)),
        "accept_rate_per_depth": [
            sum(n - 1 >= d for n in accept_lengths) / max(1, len(accept_lengths))
            for d in range(1, tree.max_depth + 1)
        ],
        "new_tokens": new_tokens,
        "steps": len(accept_lengths),
        "tokens_per_second": tokens_per_second,
        "baseline_tokens_per_second": baseline_tokens_per_second,
        "speedup": tokens_per_second / baseline_tokens_per_second,
        "step_seconds": step_seconds,
        "plain_step_seconds": plain_step_seconds,
        "step_cost_over_plain": step_seconds / plain_step_seconds,
        "identical_to_baseline": f"{sum(r['identical_to_baseline'] for r in rows)} of {len(rows)}",
        "seconds": breakdown,
        "fraction": {phase: s / decode_seconds for phase, s in breakdown.items()},
        "per_prompt": rows,
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
    p.add_argument("--target", required=True, help="HF directory (or hub id) of the target")
    p.add_argument("--heads", required=True, help="native head checkpoint directory")
    p.add_argument("--prompts", help="text file (one prompt per line) or JSONL with a 'prompt' field")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64, help="cut each prompt to this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--tree", default="medusa-63", help=f"one of {', '.join(sorted(DEFAULT_TREES))}, or chain-K (K deep)"
    )
    p.add_argument(
        "--tree-choices", help="Medusa tree choices as JSON (a string or a file); overrides --tree"
    )
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--warmup", type=int, default=1, help="untimed decodes before measuring")
    p.add_argument("--out", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    result = json.dumps(bench(args), indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(result + "\n")
    else:
        print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
