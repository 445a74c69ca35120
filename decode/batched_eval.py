"""`specheads eval --batch-size B`: batched speculative decoding against the target's own batched `generate()`.

Prompts go in consecutive groups of B, left-padded (`left_pad`). Each group is decoded by the
`BatchedSpeculativeDecoder` and by `generate(do_sample=False)` over the same padded batch, back to back,
which one first alternating from group to group; both are timed end to end (prefill included). Greedy
only. The records are those of `evaluate.decode_prompt`, one per prompt (plus "batch_size"), with the
group's wall seconds shared evenly among its rows: Σ seconds over the records is the groups' wall time,
so tokens/s and speedup (`report.summarize`) are the batched throughputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import left_pad
from specheads.decode.decoder import eos_ids, timed
from specheads.decode.report import first_mismatch, summarize
from specheads.heads.target import FrozenTarget


def pad_token_id(target: FrozenTarget) -> int:
    """The id `generate` pads finished rows (and we pad prompts) with: the generation config's, else an EOS."""
    pad = getattr(target.model.generation_config, "pad_token_id", None)
    return int(pad) if pad is not None else min(eos_ids(target), default=0)


@torch.no_grad()
def baseline_generate_batch(
    target: FrozenTarget, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
) -> list[list[int]]:
    """The target's own greedy `generate` over left-padded prompts (B, T); each row's new tokens up to its
    first EOS (kept), as `generate` would give it alone."""
    out = target.model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_token_id(target),
    )
    eos = eos_ids(target)
    rows = []
    for row in out[:, input_ids.shape[1] :].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
        rows.append(row[: end + 1])
    return rows


def decode_group(
    decoder: BatchedSpeculativeDecoder,
    target: FrozenTarget,
    prompts: Sequence[Any],
    max_new_tokens: int,
    method_first: bool,
) -> list[dict[str, Any]]:
    """Decode prompts (prompts.Prompt: id, category, input_ids (1, T)) as one left-padded batch, with the
    decoder and the baseline in the order given; one record per prompt."""
    ids, mask = left_pad([p.input_ids for p in prompts], pad_token_id(target))
    ids, mask = ids.to(target.device), mask.to(target.device)
    runs = {
        "method": lambda: decoder.generate(ids, mask, max_new_tokens),
        "baseline": lambda: baseline_generate_batch(target, ids, mask, max_new_tokens),
    }
    order = ("method", "baseline") if method_first else ("baseline", "method")
    measured = {name: timed(runs[name], target.device) for name in order}
    (out, seconds), (references, baseline_seconds) = measured["method"], measured["baseline"]
    records = []
    for prompt, row, reference in zip(prompts, out.rows, references):
        tokens = row.tokens[0].tolist()
        mismatch = first_mismatch(tokens, reference)
        records.append(
            {
                "id": prompt.id,
                "category": prompt.category,
                "prompt_tokens": prompt.input_ids.shape[1],
                "new_tokens": len(tokens),
                "steps": row.steps,
                "mean_accept_length": row.mean_accept_length if row.steps else None,
                "accept_lengths": row.accept_lengths,
                "seconds": seconds / len(prompts),
                "baseline_new_tokens": len(reference),
                "baseline_seconds": baseline_seconds / len(prompts),
                "identical_to_baseline": mismatch is None,
                "first_mismatch": mismatch,  # index into the new tokens; None when identical
                "batch_size": len(prompts),
            }
        )
    return records


def evaluate_batched(
    decoder: BatchedSpeculativeDecoder,
    target: FrozenTarget,
    prompts: Sequence[Any],
    max_new_tokens: int,
    batch_size: int,
    warmup: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Per-prompt records of the batched decoder against the target's batched `generate`, after `warmup`
    untimed groups; the decoder goes first on even groups, the baseline on odd ones."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    for i in range(warmup):  # the first calls pay for allocation and kernel selection
        decode_group(decoder, target, groups[i % len(groups)], max_new_tokens, method_first=True)
    records = []
    bar = tqdm(groups, desc=f"eval (batches of {batch_size})", unit="batch", disable=not progress)
    for i, group in enumerate(bar):
        records += decode_group(decoder, target, group, max_new_tokens, method_first=i % 2 == 0)
        so_far = summarize(records, tree_depth=0)
        tau, speedup = so_far["mean_accept_length"], so_far["speedup"]
        bar.set_postfix(
            tau="-" if tau is None else f"{tau:.2f}", speedup="-" if speedup is None else f"{speedup:.2f}"
        )
    return records
