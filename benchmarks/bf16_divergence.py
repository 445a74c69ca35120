"""Where a method's greedy output parts from generate()'s in a `specheads compare` run, and how close the
two tokens' logits are there, in the target's own fp32 and bf16 forwards over the common prefix.

A bf16 run can part from generate() without any fault in verification: a tree forward over N tokens and
generate()'s one-token forwards round differently, so at a near tie they can pick different tokens. This
prints, for every output that is not identical, the first token that differs and the logit gap between
generate()'s token and the method's (positive: fp32 agrees with generate()), beside the bf16 spacing at
that logit's size.

    python benchmarks/bf16_divergence.py --run COMPARE_DIR --target TARGET_DIR [--prompts heldout]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from specheads.core.target import FrozenTarget
from specheads.evaluate.prompts import encode_prompts, read_prompts


def first_answers(run: Path, method: str) -> dict[str, str]:
    """question id -> the method's first-turn answer text, from the run's answers/ folder."""
    rows = [json.loads(line) for line in (run / "answers" / f"{method}.jsonl").open()]
    return {str(r["question_id"]): r["choices"][0]["turns"][0] for r in rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--run", type=Path, required=True, help="a `specheads compare --out` folder (answers/ in it)"
    )
    p.add_argument("--target", required=True, help="the target's HF directory")
    p.add_argument("--prompts", default="heldout")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=64)
    args = p.parse_args(argv)

    targets = {dt: FrozenTarget.from_pretrained(args.target, dtype=dt) for dt in ("float32", "bfloat16")}
    tokenizer = targets["float32"].tokenizer
    texts = read_prompts(args.prompts, args.target, num_prompts=args.num_prompts)
    prompts, _ = encode_prompts(texts, tokenizer, use_chat_template=True, prompt_tokens=args.prompt_tokens)
    base = first_answers(args.run, "generate")
    methods = sorted(f.stem for f in (args.run / "answers").glob("*.jsonl") if f.stem != "generate")
    print("| method | prompt | token | generate() | method | gap fp32 | gap bf16 | bf16 spacing |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for method in methods:
        theirs = first_answers(args.run, method)
        for prompt in prompts:
            a = tokenizer(base[prompt.id], add_special_tokens=False)["input_ids"]
            b = tokenizer(theirs[prompt.id], add_special_tokens=False)["input_ids"]
            i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
            if i is None:
                continue  # identical, or one is a prefix of the other (an early stop)
            ids = torch.cat([prompt.input_ids.view(1, -1), torch.tensor([a[:i]], dtype=torch.long)], dim=1)
            with torch.no_grad():
                logits = {dt: t.model(ids).logits[0, -1].float() for dt, t in targets.items()}
            gaps = {dt: (x[a[i]] - x[b[i]]).item() for dt, x in logits.items()}
            # bf16 keeps 8 significant bits: the step between neighbours at generate()'s bf16 logit
            spacing = 2.0 ** (math.floor(math.log2(abs(logits["bfloat16"][a[i]].item()) or 1.0)) - 7)
            print(
                f"| {method} | {prompt.id} | {i} | {a[i]} | {b[i]} | {gaps['float32']:+.4f} | "
                f"{gaps['bfloat16']:+.4f} | {spacing:.4f} |"
            )


if __name__ == "__main__":
    main()
