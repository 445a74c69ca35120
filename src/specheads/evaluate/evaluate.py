"""`specheads eval`: speculative decoding measured against the target's own `generate()`.

    specheads eval --target runs/target --heads runs/medusa \\
        --prompts mt-bench --num-prompts 20 --out runs/eval-mt-bench
    specheads eval --target runs/target --heads runs/medusa --prompts heldout --out runs/eval-heldout

For every prompt, in one run on one machine, the speculative decoder and the baseline, the target's
own `model.generate(do_sample=False, max_new_tokens=N)`, decode it back to back. Which of the two
goes first alternates from prompt to prompt, so slow drift (clocks, caches, other processes) favours
neither. Both are timed end to end (prefill included). Writes `results.json` and `report.md`.
While it runs, each finished prompt is appended to `progress.jsonl` (evaluate/progress.py): a run stopped
by Ctrl-C or SIGTERM keeps them, and `--resume` (or the same command again) decodes only the rest, with
the same order and seeds, so results.json holds the same outputs as an uninterrupted run.

`--tree auto` first calibrates the tree on this machine: the last `--calibration-prompts` prompts (4 by
default) are held out of the evaluation, and the tree size with the most expected tokens/s on them is used
(evaluate/calibrate.py; results.json["calibration"] holds what was measured).

`--temperature T > 0` (with `--top-k`, `--top-p`) samples instead: the decoder with lossless sampling
verification and a CPU generator seeded `--seed` + the prompt's index, the baseline with
`generate(do_sample=True, temperature=T, top_k, top_p)` (top_k always passed: generate's own default
is 50) after `torch.manual_seed(--seed + index)`. Both sample the same distribution, so their outputs
differ by chance and `identical_to_baseline` is null; results.json records the settings.

Prompts come from:
    *.jsonl      MT-Bench / Spec-Bench questions ({"question_id", "category", "turns": [...]}): the
                 first turn, rendered with the target's chat template when it has one
                 (`--no-chat-template`: the raw text).
    heldout      the target directory's heldout_files.json (written by `specheads tiny-target`): the
                 first `--prompt-tokens` tokens of each listed file, as raw text.
    *.json       any file list in that same format ({"stdlib": root, "files": [paths under root]}).

Terms (all taken over every prompt together, never as a mean of per-prompt ratios):
    step           one speculative step: one target forward over a draft tree.
    accept length  the tokens one step emits: its accepted draft tokens plus the bonus token (so >= 1);
                   a step that reaches EOS or max_new_tokens counts only the tokens kept.
    τ              mean_accept_length = Σ accept lengths / steps (1.0 = autoregressive). Each prompt's
                   first new token comes from the prefill forward, which is not a step, so
                   new_tokens = Σ accept lengths + (prompts with any output).
    tokens/s       Σ new tokens / Σ wall seconds of the generate calls (prefill included), for the
                   decoder and the baseline alike; speedup = decoder tokens/s ÷ baseline tokens/s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from specheads.core.target import FrozenTarget
from specheads.decode.baseline import generate_rows
from specheads.decode.decoder import DecodeOutput, SpeculativeDecoder, timed
from specheads.decode.sampling import SamplingParams
from specheads.evaluate.calibrate import (
    calibration_note,
)
from specheads.evaluate.prompts import Prompt
from specheads.evaluate.report import (
    prompt_record,
    render_report,
    summarize,
)

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"


# -- timing -----------------------------------------------------------------------------------------


@torch.no_grad()
def baseline_generate(
    target: FrozenTarget,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int = 0,
) -> list[int]:
    """The target's own `generate`, greedy or sampling p (seeded); the new tokens (it stops at its
    generation config's EOS)."""
    how = {}
    if sampling is not None:
        torch.manual_seed(seed)  # generate draws from torch's global RNG
        how = sampling.generate_kwargs()
    return generate_rows(target, prompt_ids, max_new_tokens, **how)[0]


def decode_prompt(
    decoder: SpeculativeDecoder,
    target: FrozenTarget,
    prompt: Prompt,
    max_new_tokens: int,
    method_first: bool,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    draft_vocab: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Decode one prompt with the decoder and the baseline (in the order given); its record.

    With `sampling`, both sample (seeded with `seed`) and identical_to_baseline / first_mismatch are None.
    `draft_vocab`: the mask of the tokens the draft can propose, whose share of the output the record counts.
    """
    ids = prompt.input_ids.to(target.device)
    sampled = {}
    if sampling is not None:
        sampled = {"do_sample": True, **sampling.to_dict(), "generator": torch.Generator().manual_seed(seed)}
    runs = {
        "method": lambda: decoder.generate(ids, max_new_tokens, **sampled),
        "baseline": lambda: baseline_generate(target, ids, max_new_tokens, sampling, seed),
    }
    order = ("method", "baseline") if method_first else ("baseline", "method")
    measured = {name: timed(runs[name], target.device) for name in order}
    out: DecodeOutput = measured["method"][0]
    tokens, reference = out.tokens[0].tolist(), measured["baseline"][0]
    return prompt_record(
        prompt,
        tokens,
        out.accept_lengths,
        measured["method"][1],
        reference,
        measured["baseline"][1],
        sampled=sampling is not None,
        phase_seconds=out.timings,
        draft_vocab=draft_vocab,
    )


@dataclass(frozen=True)
class EvalRun:
    """How `evaluate` and `evaluate_batched` go through their prompts (each group of prompts, batched).

    warmup: untimed prompts (groups) decoded first, for allocation and kernel selection.
    progress: show a progress bar with τ and the speedup so far.
    sampling: None decodes greedily; else both the decoder and the baseline sample, prompt (group) n
        seeded with `seed + n` on both sides.
    done: the records of the first prompts (whole groups), finished by an earlier run
        (evaluate/progress.py); decoding goes on after them, with the same order and seeds.
    on_record: called with each new record as soon as its prompt (group) is finished.
    draft_vocab: the (V,) bool mask of the tokens the draft can propose (`drafter_factory.draft_vocab_mask`;
        None: all), whose share of each output its record counts.
    indices: each prompt's (group's) number in the whole run, which decides its order and seed (a process
        of several decodes every N-th; None: 0, 1, 2, ...). The decoder goes first on even numbers, the
        baseline on odd ones.
    """

    warmup: int = 1
    progress: bool = True
    sampling: SamplingParams | None = None
    seed: int = 0
    done: list[dict[str, Any]] | None = None
    on_record: Callable[[dict[str, Any]], None] | None = None
    draft_vocab: torch.Tensor | None = None
    indices: list[int] | None = None


def evaluate(
    decoder: SpeculativeDecoder,
    target: FrozenTarget,
    prompts: list[Prompt],
    max_new_tokens: int,
    run: EvalRun | None = None,
) -> list[dict[str, Any]]:
    """Per-prompt records of the decoder against the baseline (`decode_prompt`), prompt after prompt, as
    `run` says."""
    run = run or EvalRun()

    def decode(group: list[Prompt], method_first: bool, seed: int, vocab: torch.Tensor | None):
        return [
            decode_prompt(decoder, target, group[0], max_new_tokens, method_first, run.sampling, seed, vocab)
        ]

    return decode_in_turn(decode, [[prompt] for prompt in prompts], run, "eval", "prompt")


def decode_in_turn(
    decode: Callable[[Sequence[Prompt], bool, int, torch.Tensor | None], list[dict[str, Any]]],
    groups: list[Sequence[Prompt]],
    run: EvalRun,
    desc: str,
    unit: str,
) -> list[dict[str, Any]]:
    """The records of every group of prompts, in order, after `run.warmup` untimed groups.
    `decode(group, method_first, seed, draft_vocab)` decodes one group with the decoder and the baseline,
    in that order or the other, and returns its records. `desc`, `unit`: the progress bar's words."""
    count = sum(len(group) for group in groups)
    indices = list(range(len(groups))) if run.indices is None else list(run.indices)
    records = list(run.done or [])
    if len(records) >= count:
        return records[:count]
    if len(records) % len(groups[0]):
        raise ValueError(f"{len(records)} finished prompts are not whole batches of {len(groups[0])}")
    for i in range(run.warmup):  # the first calls pay for allocation and kernel selection
        decode(groups[i % len(groups)], True, run.seed + i, None)
    first = len(records) // len(groups[0])
    bar = tqdm(groups, desc=desc, unit=unit, disable=not run.progress, initial=first)
    for i, group in enumerate(groups):
        if i < first:
            continue
        n = indices[i]
        new = decode(group, n % 2 == 0, run.seed + n, run.draft_vocab)
        records += new
        for record in new if run.on_record is not None else ():
            run.on_record(record)
        bar.update(1)
        so_far = summarize(records, tree_depth=0)
        bar.set_postfix(tau=_fmt(so_far["mean_accept_length"]), speedup=_fmt(so_far["speedup"]))
    bar.close()
    return records


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


# -- writing (the run itself, its options, checks and results.json: evaluate/run.py) -------------------


def sampling_record(sampling: SamplingParams | None, seed: int) -> dict[str, Any]:
    """results.json's "sampling": the decoder's settings and the baseline call they are compared with."""
    if sampling is None:
        greedy = {"temperature": 0.0, "top_k": None, "top_p": None, "seed": None, "acceptance": "greedy"}
        return {"do_sample": False, **greedy, "baseline": "generate(do_sample=False)"}
    call = ", ".join(f"{k}={v}" for k, v in sampling.to_dict().items())
    exact = {"seed": seed, "acceptance": "exact", "baseline": f"generate(do_sample=True, {call})"}
    return {"do_sample": True, **sampling.to_dict(), **exact}


def report_text(results: dict[str, Any]) -> str:
    """report.md; sampled runs show "–" for identical (null in results.json) and say what was sampled."""
    if "calibration" in results:
        return render_report(results).replace("\nReproduce:", calibration_note(results) + "\nReproduce:", 1)
    if not results["sampling"]["do_sample"]:
        return render_report(results)
    s = results["sampling"]
    note = (
        f"- sampled: temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}, seed {s['seed']} "
        f"(prompt i: seed + i); lossless verification; the baseline is `{s['baseline']}`, so outputs differ "
        f"by chance and identical is not measured.\n"
    )
    return render_report(results).replace("\nReproduce:", note + "\nReproduce:", 1)
