"""`specheads eval`: speculative decoding measured against the target's own `generate()`.

    specheads eval --target runs/target --heads runs/medusa \\
        --prompts ../shared/data/mt_bench_question.jsonl --num-prompts 20 --out runs/eval-mt-bench
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

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
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
    DEFINITIONS,
    per_category,
    prompt_record,
    render_report,
    run_environment,
    summarize,
)
from specheads.heads.checkpoint import heads_adapter

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


def evaluate(
    decoder: SpeculativeDecoder,
    target: FrozenTarget,
    prompts: list[Prompt],
    max_new_tokens: int,
    warmup: int = 1,
    progress: bool = True,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    done: list[dict[str, Any]] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    draft_vocab: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """Per-prompt records of the decoder against the baseline, after `warmup` untimed prompts.

    The order alternates: the decoder goes first on even prompts, the baseline on odd ones. With
    `sampling`, prompt i is sampled with seed `seed + i` on both sides. `done`: the records of the first
    prompts, finished by an earlier run (evaluate/progress.py); decoding goes on after them, with the same
    order and seeds. `on_record` is called with each new record as soon as it is finished. `draft_vocab`:
    the (V,) bool mask of the tokens the draft can propose (`drafter_factory.draft_vocab_mask`; None: all),
    whose share of each output its record counts.
    """
    records = list(done or [])
    if len(records) >= len(prompts):
        return records[: len(prompts)]
    for i in range(warmup):  # the first calls pay for allocation and kernel selection
        prompt = prompts[i % len(prompts)]
        decode_prompt(decoder, target, prompt, max_new_tokens, True, sampling, seed + i)
    bar = tqdm(prompts, desc="eval", unit="prompt", disable=not progress, initial=len(records))
    for i, prompt in enumerate(prompts):
        if i < len(records):
            continue
        records.append(
            decode_prompt(
                decoder, target, prompt, max_new_tokens, i % 2 == 0, sampling, seed + i, draft_vocab
            )
        )
        if on_record is not None:
            on_record(records[-1])
        bar.update(1)
        so_far = summarize(records, tree_depth=0)
        bar.set_postfix(tau=_fmt(so_far["mean_accept_length"]), speedup=_fmt(so_far["speedup"]))
    bar.close()
    return records


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


# -- writing ----------------------------------------------------------------------------------------


def command_line(args: argparse.Namespace, tree_name: str) -> str:
    """The `specheads eval` command with every option spelled out (the tree too), so it reproduces this run."""
    parts = ["specheads", "eval", "--target", args.target, "--heads", args.heads, "--prompts", args.prompts]
    parts += ["--out", str(args.out), "--max-new-tokens", str(args.max_new_tokens)]
    parts += ["--prompt-tokens", str(args.prompt_tokens), "--warmup", str(args.warmup)]
    parts += ["--dtype", args.dtype, "--device", args.device, "--attn", args.attn, "--tree", tree_name]
    parts += ["--temperature", str(args.temperature), "--top-k", str(args.top_k), "--top-p", str(args.top_p)]
    parts += ["--seed", str(args.seed), "--batch-size", str(args.batch_size)]
    for flag, value in (
        ("--threads", args.threads),
        ("--num-prompts", args.num_prompts),
        ("--category", args.category),
        ("--calibration-prompts", args.calibration_prompts),
        ("--draft-vocab", args.draft_vocab),
    ):
        if value is not None:
            parts += [flag, str(value)]
    if args.no_chat_template:
        parts.append("--no-chat-template")
    if getattr(args, "recalibrate", False):
        parts.append("--recalibrate")
    return " ".join(shlex.quote(p) for p in parts)


# -- the command ------------------------------------------------------------------------------------


def _check_args(args: argparse.Namespace) -> None:
    for flag in ("max_new_tokens", "prompt_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device is available here")
    if args.calibration_prompts is not None and (
        args.tree not in ("auto", None) or args.calibration_prompts < 1
    ):
        raise ValueError(
            f"--calibration-prompts must be >= 1, with --tree auto; got {args.calibration_prompts}"
        )
    if args.tree == "auto" and (args.batch_size > 1 or args.temperature > 0):
        raise ValueError(
            "--tree auto calibrates greedy decoding one prompt at a time: not with --batch-size > 1 "
            "or --temperature > 0"
        )
    if args.out.exists() and not args.out.is_dir():
        raise NotADirectoryError(f"--out {args.out} exists and is not a directory")
    sampling_params(args)


def sampling_params(args: argparse.Namespace) -> SamplingParams | None:
    """The settings of `--temperature/--top-k/--top-p`; None for greedy (temperature 0).

    Raises:
        ValueError: for a negative temperature or a bad top-k / top-p (checked at temperature 0 too).
    """
    try:  # temperature 0 is greedy, not a SamplingParams; 1.0 stands in to check top-k / top-p
        params = SamplingParams(args.temperature or 1.0, args.top_k, args.top_p)
    except ValueError as e:
        raise ValueError(f"--temperature / --top-k / --top-p: {e}") from e
    return params if args.temperature > 0 else None


def build_results(
    args: argparse.Namespace,
    records: list[dict[str, Any]],
    head_config: dict[str, Any],
    target: FrozenTarget,
    tree: dict[str, Any],
    templated: bool,
    calibration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """results.json: the headline figures first, then what produced them, then the per-prompt records."""
    sampling = sampling_params(args)
    return {
        "method": head_config["method"],
        **summarize(records, tree["depth"]),
        "per_category": per_category(records, tree["depth"]),
        "sampling": sampling_record(sampling, args.seed),
        "tree": tree,
        **({"calibration": calibration} if calibration else {}),
        "heads": {
            "path": str(Path(args.heads).resolve()),
            "method": head_config["method"],
            "head_config": head_config["head_config"],
            "training": head_config.get("training", {}),
            "specheads_version": head_config.get("specheads_version"),
            "adapter": _path_or_none(heads_adapter(args.heads)),  # Medusa-2: merged into the target
            "draft_vocab": args.draft_vocab,  # proposed from the N most frequent labels
        },
        "target": {**target.record().to_dict(), "path": args.target},
        "prompts": {
            "source": args.prompts,
            "chat_template": templated,
            "prompt_tokens": args.prompt_tokens,
            "category": args.category,
        },
        "max_new_tokens": args.max_new_tokens,
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        **run_environment(target, args.attn),
        "command": command_line(args, "auto" if calibration else tree["name"]),
        "definitions": DEFINITIONS,
        "per_prompt": records,
    }


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


def _path_or_none(path: Path | None) -> str | None:
    return None if path is None else str(path.resolve())
