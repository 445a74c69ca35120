"""`specheads eval`: speculative decoding measured against the target's own `generate()`.

    specheads eval --target runs/target --heads runs/medusa \\
        --prompts ../shared/data/mt_bench_question.jsonl --num-prompts 20 --out runs/eval-mt-bench
    specheads eval --target runs/target --heads runs/medusa --prompts heldout --out runs/eval-heldout

For every prompt, in one run on one machine, the speculative decoder and the baseline, the target's
own `model.generate(do_sample=False, max_new_tokens=N)`, decode it back to back. Which of the two
goes first alternates from prompt to prompt, so slow drift (clocks, caches, other processes) favours
neither. Both are timed end to end (prefill included). Writes `results.json` and `report.md`.

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
import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.decoder import DecodeOutput, SpeculativeDecoder, timed
from specheads.decode.sampling import SamplingParams
from specheads.evaluate.baseline import generate_rows
from specheads.evaluate.batched_eval import evaluate_batched
from specheads.evaluate.calibrate import (
    CalibrationSettings,
    calibrated_drafter,
    calibration_note,
    hold_out,
    max_tree_depth,
)
from specheads.evaluate.eval_drafters import (  # noqa: F401 (EAGLE_TOTAL_TOKENS: re-exported)
    EAGLE_TOTAL_TOKENS,
    add_tree_argument,
    check_tree_for_method,
    drafter_for,
)
from specheads.evaluate.prompts import Prompt, check_prompt_lengths, encode_prompts, read_prompts
from specheads.evaluate.report import DEFINITIONS, per_category, prompt_record, render_report, summarize
from specheads.heads import FrozenTarget, load_heads, read_head_config
from specheads.heads.atomic import write_text
from specheads.heads.checkpoint import heads_adapter, target_for_heads
from specheads.heads.named_targets import resolve_target
from specheads.heads.run_folder import claim_results_folder, hold_folder
from specheads.heads.target import DTYPES
from specheads.version import __version__

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
) -> dict[str, Any]:
    """Decode one prompt with the decoder and the baseline (in the order given); its record.

    With `sampling`, both sample (seeded with `seed`) and identical_to_baseline / first_mismatch are None.
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
) -> list[dict[str, Any]]:
    """Per-prompt records of the decoder against the baseline, after `warmup` untimed prompts.

    The order alternates: the decoder goes first on even prompts, the baseline on odd ones. With
    `sampling`, prompt i is sampled with seed `seed + i` on both sides.
    """
    for i in range(warmup):  # the first calls pay for allocation and kernel selection
        prompt = prompts[i % len(prompts)]
        decode_prompt(decoder, target, prompt, max_new_tokens, True, sampling, seed + i)
    records = []
    bar = tqdm(prompts, desc="eval", unit="prompt", disable=not progress)
    for i, prompt in enumerate(bar):
        records.append(decode_prompt(decoder, target, prompt, max_new_tokens, i % 2 == 0, sampling, seed + i))
        so_far = summarize(records, tree_depth=0)
        bar.set_postfix(tau=_fmt(so_far["mean_accept_length"]), speedup=_fmt(so_far["speedup"]))
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
    ):
        if value is not None:
            parts += [flag, str(value)]
    if args.no_chat_template:
        parts.append("--no-chat-template")
    return " ".join(shlex.quote(p) for p in parts)


# -- the command ------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        required=True,
        help='HF directory or hub id of the target, or a named one ("tiny", "smollm2")',
    )
    p.add_argument(
        "--heads", required=True, help="native head checkpoint directory (its config.json names the method)"
    )
    p.add_argument(
        "--prompts",
        required=True,
        help="a .jsonl of MT-Bench / Spec-Bench questions, `heldout` (the target's heldout_files.json), "
        "or a .json file list in that format",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace the results --out holds (refused without it)"
    )
    p.add_argument(
        "--allow-target-mismatch",
        action="store_true",
        help="evaluate heads whose recorded target weights fingerprint differs from --target's",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for results.json and report.md")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    p.add_argument("--category", default=None, help="only questions of this category")
    p.add_argument("--no-chat-template", action="store_true", help="questions as raw text, not chat turns")
    p.add_argument(
        "--prompt-tokens", type=int, default=64, help="tokens taken from the start of each file prompt"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    add_tree_argument(p, auto=True)
    p.add_argument(
        "--calibration-prompts",
        type=int,
        default=None,
        help="--tree auto: calibrate on the last K prompts of --prompts, which are then not evaluated "
        "(default 4); --num-prompts counts the rest",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (default): greedy, checked token for token against generate(do_sample=False); > 0: both "
        "sample, the decoder losslessly, the baseline with generate(do_sample=True, ...)",
    )
    p.add_argument(
        "--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0, the default: all)"
    )
    p.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass kept (default 1.0: all)")
    p.add_argument(
        "--seed", type=int, default=0, help="sampling: prompt (or batch) i is sampled with seed + i"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed prompts decoded first")
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="decode the prompts B at a time, left-padded, against the target's own batched generate "
        "(with --temperature, batch i sampled with seed + i; each prompt's seconds are its batch's, shared "
        "evenly)",
    )
    p.add_argument("--dtype", default="float32", choices=[*sorted(DTYPES), "auto"])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i]")
    p.add_argument(
        "--attn", default="sdpa", choices=["sdpa", "eager"], help="the target's attention implementation"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's own)")
    p.add_argument("--no-progress", action="store_true")


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
    if args.calibration_prompts is not None and (args.tree != "auto" or args.calibration_prompts < 1):
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
    import transformers

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
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "attn_implementation": args.attn,
        "threads": torch.get_num_threads(),
        "versions": {
            "specheads": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "platform": platform.platform(),
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


def run(args: argparse.Namespace) -> int:
    """`specheads eval`: check every input, decode every prompt both ways, write the results."""
    _check_args(args)
    claim_results_folder(args.out, (RESULTS_FILE, REPORT_FILE), args.overwrite)  # before any loading
    head_config = read_head_config(args.heads)  # a missing or foreign checkpoint fails before any loading
    check_tree_for_method(head_config["method"], None if args.tree == "auto" else args.tree)
    target_path = resolve_target(args.target)  # a named target (tiny, smollm2) is found or built here
    texts = read_prompts(args.prompts, target_path, args.category)
    held_out, texts = hold_out(texts, args.calibration_prompts) if args.tree == "auto" else ([], texts)
    texts = texts[: args.num_prompts]

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target = FrozenTarget.from_pretrained(target_path, dtype=args.dtype, attn_implementation=args.attn)
    target = target_for_heads(target, args.heads)  # Medusa-2: the adapted target decodes, both ways
    target.model.to(args.device)
    if target.tokenizer is None:
        raise ValueError(f"target {args.target!r} has no tokenizer; eval needs one to encode prompts")
    heads, head_config = load_heads(
        args.heads,
        target,
        device=target.device,
        dtype=target.dtype,
        allow_target_mismatch=args.allow_target_mismatch,
    )
    prompts, templated = encode_prompts(
        texts, target.tokenizer, not args.no_chat_template, args.prompt_tokens
    )
    if args.tree == "auto":  # evaluate/calibrate.py
        held_out, _ = encode_prompts(
            held_out, target.tokenizer, not args.no_chat_template, args.prompt_tokens
        )
        settings = CalibrationSettings(max_new_tokens=args.max_new_tokens)
        depth = max_tree_depth(heads, head_config, settings)
        check_prompt_lengths(prompts + held_out, target.config, args.max_new_tokens, depth)
        drafter, tree, calibration = calibrated_drafter(heads, head_config, target, held_out, settings)
    else:
        (drafter, tree), calibration = drafter_for(heads, head_config, target, args.tree), None
    check_prompt_lengths(prompts, target.config, args.max_new_tokens, tree["depth"])
    with hold_folder(args.out):  # a second eval or compare on --out stops at once
        sampling = sampling_params(args)
        if args.batch_size > 1:
            decoder = BatchedSpeculativeDecoder(target, drafter)
            records = evaluate_batched(
                decoder,
                target,
                prompts,
                args.max_new_tokens,
                args.batch_size,
                args.warmup,
                not args.no_progress,
                sampling=sampling,
                seed=args.seed,
            )
        else:
            records = evaluate(
                SpeculativeDecoder(target, drafter),
                target,
                prompts,
                args.max_new_tokens,
                args.warmup,
                progress=not args.no_progress,
                sampling=sampling,
                seed=args.seed,
            )
        results = build_results(args, records, head_config, target, tree, templated, calibration)
        write_text(args.out / RESULTS_FILE, json.dumps(results, indent=1) + "\n")
        write_text(args.out / REPORT_FILE, report_text(results))
        print(report_text(results), end="")
        print(f"wrote {args.out / RESULTS_FILE} and {args.out / REPORT_FILE}")
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specheads eval", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
