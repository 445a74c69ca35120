"""`specheads eval --batch-size B`: batched speculative decoding against the target's own batched `generate()`.

Prompts go in consecutive groups of B, left-padded (`left_pad`). Each group is decoded by the
`BatchedSpeculativeDecoder` and by `generate(do_sample=False)` over the same padded batch, back to back,
which one first alternating from group to group; both are timed end to end (prefill included). With
sampling settings both sample instead, group i seeded with seed + i on both sides. The records are those of `evaluate.decode_prompt`, one per prompt (plus "batch_size"), with the
group's wall seconds shared evenly among its rows: Σ seconds over the records is the groups' wall time,
so tokens/s and speedup (`report.summarize`) are the batched throughputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.baseline import generate_rows, pad_token_id
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import left_pad
from specheads.decode.decoder import timed
from specheads.decode.sampling import SamplingParams
from specheads.evaluate.evaluate import EvalRun, decode_in_turn
from specheads.evaluate.report import prompt_record


def decode_group(
    decoder: BatchedSpeculativeDecoder,
    target: FrozenTarget,
    prompts: Sequence[Any],
    max_new_tokens: int,
    method_first: bool,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    draft_vocab: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """Decode prompts (prompts.Prompt: id, category, input_ids (1, T)) as one left-padded batch, with the
    decoder and the baseline in the order given, greedy or sampling (seeded with `seed`); one record per
    prompt (counting its tokens in `draft_vocab`, the mask of those the draft can propose, when given)."""
    ids, mask = left_pad([p.input_ids for p in prompts], pad_token_id(target))
    ids, mask = ids.to(target.device), mask.to(target.device)
    sampled, how = {}, {}
    if sampling is not None:
        sampled = {"do_sample": True, **sampling.to_dict(), "generator": torch.Generator().manual_seed(seed)}
        how = sampling.generate_kwargs()

    def baseline() -> list[list[int]]:
        if sampling is not None:
            torch.manual_seed(seed)  # generate draws from torch's global RNG
        return generate_rows(target, ids, max_new_tokens, mask, **how)

    runs = {"method": lambda: decoder.generate(ids, mask, max_new_tokens, **sampled), "baseline": baseline}
    order = ("method", "baseline") if method_first else ("baseline", "method")
    measured = {name: timed(runs[name], target.device) for name in order}
    (out, seconds), (references, baseline_seconds) = measured["method"], measured["baseline"]
    share, baseline_share = seconds / len(prompts), baseline_seconds / len(prompts)
    records = []
    for prompt, row, reference in zip(prompts, out.rows, references):
        record = prompt_record(
            prompt,
            row.tokens[0].tolist(),
            row.accept_lengths,
            share,
            reference,
            baseline_share,
            sampled=sampling is not None,
            draft_vocab=draft_vocab,
        )
        records.append({**record, "batch_size": len(prompts)})
    return records


def evaluate_batched(
    decoder: BatchedSpeculativeDecoder,
    target: FrozenTarget,
    prompts: Sequence[Any],
    max_new_tokens: int,
    batch_size: int,
    run: EvalRun | None = None,
) -> list[dict[str, Any]]:
    """Per-prompt records of the batched decoder against the target's batched `generate` (`decode_group`),
    group of `batch_size` after group, as `run` says (`evaluate.EvalRun`: its numbers are the groups')."""
    run = run or EvalRun()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]

    def decode(group: Sequence[Any], method_first: bool, seed: int, vocab: torch.Tensor | None):
        return decode_group(decoder, target, group, max_new_tokens, method_first, run.sampling, seed, vocab)

    return decode_in_turn(decode, groups, run, f"eval (batches of {batch_size})", "batch")
