"""`specheads eval --target DIR --heads DIR --prompts FILE --out DIR`: speculative decoding against the
target's own generate() (evaluate/evaluate.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from specheads.builders.named_targets import resolve_target
from specheads.cli.threads import add_threads_argument
from specheads.core.atomic import write_text
from specheads.core.run_folder import claim_results_folder, clear, hold_folder
from specheads.core.target import DTYPES, FrozenTarget
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.calibrate import CalibrationSettings
from specheads.decode.decoder import SpeculativeDecoder
from specheads.decode.drafter_factory import (
    check_tree_for_method,
    draft_vocab_mask,
    drafter_for,
    tree_by_default,
)
from specheads.decode.step import decoding_attention
from specheads.evaluate.batched_eval import evaluate_batched
from specheads.evaluate.calibrate import calibrated_once, hold_out, holds_out, max_tree_depth
from specheads.evaluate.eval_drafters import (
    add_draft_vocab_argument,
    add_recalibrate_argument,
    add_tree_argument,
)
from specheads.evaluate.evaluate import (
    REPORT_FILE,
    RESULTS_FILE,
    _check_args,
    build_results,
    command_line,
    evaluate,
    report_text,
    sampling_params,
)
from specheads.evaluate.progress import PROGRESS_FILE, Progress, stop_on_sigterm, stopped_message
from specheads.evaluate.prompts import check_prompt_lengths, encode_prompts, read_prompts
from specheads.heads import load_heads, read_head_config
from specheads.heads.checkpoint import draft_vocab_ids, target_for_heads
from specheads.methods import method_named, methods


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
        help="mt-bench, spec-bench, a .jsonl of such questions, `heldout` (the target's "
        "heldout_files.json), or a .json file list in that format",
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
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"go on from the prompts a stopped run kept in --out's {PROGRESS_FILE} (a re-run with the same "
        "settings on a folder holding only that file resumes too; other settings are refused)",
    )
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
    add_recalibrate_argument(p)
    add_draft_vocab_argument(p)
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
    p.add_argument("--no-progress", action="store_true")
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    """`specheads eval`: check every input, decode every prompt both ways, write the results."""
    _check_args(args)
    if args.resume and args.overwrite:
        raise ValueError("--resume goes on from a stopped run, --overwrite starts over: give one of them")
    table = methods()
    head_config = read_head_config(
        args.heads, methods=table
    )  # a missing or foreign checkpoint fails before any loading
    calibrates = args.batch_size == 1 and args.temperature == 0
    default_auto = (
        args.tree is None and tree_by_default(head_config["method"], calibrates, methods=table) == "auto"
    )
    if args.calibration_prompts is not None and args.tree is None and not default_auto:
        raise ValueError(
            f"--calibration-prompts must be >= 1, with --tree auto; got {args.calibration_prompts} for "
            f"{head_config['method']} heads, whose default tree here is not auto"
        )
    claim_results_folder(args.out, (RESULTS_FILE, REPORT_FILE), args.overwrite)  # before any loading
    if args.overwrite:
        clear(args.out, [PROGRESS_FILE])  # a stopped run's progress is replaced too
    check_tree_for_method(head_config["method"], None if args.tree == "auto" else args.tree, methods=table)
    if args.draft_vocab is not None:
        why = method_named(head_config["method"]).draft_vocab
        if why or args.draft_vocab < 1:
            raise ValueError(
                f"--draft-vocab {args.draft_vocab}: a count >= 1, for heads whose drafter takes one "
                f"({head_config['method']}: {why or 'it does'})"
            )
    target_path = resolve_target(args.target)  # a named target (tiny, smollm2) is found or built here
    texts = read_prompts(args.prompts, target_path, args.category)
    if default_auto and (
        args.calibration_prompts is not None or holds_out(len(texts), None, args.num_prompts)
    ):
        args.tree = "auto"  # these heads' default (its Method's default_tree); the command records it
        print(
            f"--tree auto: the default for {head_config['method']} heads (--tree NAME decodes a fixed tree)"
        )
    held_out, texts = hold_out(texts, args.calibration_prompts) if args.tree == "auto" else ([], texts)
    texts = texts[: args.num_prompts]

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
        methods=table,
    )
    prompts, templated = encode_prompts(
        texts, target.tokenizer, not args.no_chat_template, args.prompt_tokens
    )
    vocab = None
    if args.draft_vocab is not None:
        vocab = draft_vocab_ids(args.heads, args.draft_vocab, target.vocab_size)
    if args.tree == "auto":  # evaluate/calibrate.py, once the progress file is open (a resume reuses it)
        held_out, _ = encode_prompts(
            held_out, target.tokenizer, not args.no_chat_template, args.prompt_tokens
        )
        calibration_settings = CalibrationSettings(max_new_tokens=args.max_new_tokens)
        depth = max_tree_depth(heads, head_config, calibration_settings, methods=table)
        check_prompt_lengths(prompts + held_out, target.config, args.max_new_tokens, depth)
        tree = "auto"
    else:
        drafter, tree = drafter_for(heads, head_config, target, args.tree, vocab, methods=table)
        check_prompt_lengths(prompts, target.config, args.max_new_tokens, tree["depth"])
    with hold_folder(args.out):  # a second eval or compare on --out stops at once
        sampling = sampling_params(args)
        settings = progress_settings(args, head_config, target, tree, templated, prompts, held_out)
        progress = Progress(args.out, "eval", settings, resume=args.resume)
        if progress.done:
            print(f"resuming: {len(progress.done)} of {len(prompts)} prompts already done ({progress.path})")
        how = {"sampling": sampling, "seed": args.seed, "done": progress.done, "on_record": progress.append}
        calibration = None
        try:
            # SIGTERM stops as Ctrl-C does (what is finished stays in progress.jsonl); the baseline runs with
            # the decoder's attention backends (decode/step.py)
            with stop_on_sigterm(), decoding_attention(target.device):
                if args.tree == "auto":
                    drafter, tree, calibration = calibrated_once(
                        progress,
                        "calibration",
                        heads,
                        head_config,
                        target,
                        held_out,
                        calibration_settings,
                        vocab,
                        reuse=not args.recalibrate,
                        methods=table,
                    )
                how["draft_vocab"] = draft_vocab_mask(drafter, target.vocab_size)
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
                        **how,
                    )
                else:
                    records = evaluate(
                        SpeculativeDecoder(target, drafter),
                        target,
                        prompts,
                        args.max_new_tokens,
                        args.warmup,
                        progress=not args.no_progress,
                        **how,
                    )
        except KeyboardInterrupt:
            command = command_line(args, "auto" if args.tree == "auto" else tree["name"])
            print(stopped_message(command, len(progress.done), len(prompts), args.out))
            raise
        results = build_results(args, records, head_config, target, tree, templated, calibration)
        write_text(args.out / RESULTS_FILE, json.dumps(results, indent=1) + "\n")
        write_text(args.out / REPORT_FILE, report_text(results))
        progress.remove()
        print(report_text(results), end="")
        print(f"wrote {args.out / RESULTS_FILE} and {args.out / REPORT_FILE}")
        return 0


def progress_settings(args, head_config, target, tree, templated, prompts, held_out=()) -> dict:
    """progress.jsonl's header: every setting that decides the token outputs (never timings, warmup,
    threads), so that a resumed run continues only the same run. `tree` is the tree's record, or "auto":
    the calibrated tree is kept beside the settings (`calibrated_once`), on `held_out` prompts."""
    ids = hashlib.sha256()
    for prompt in prompts:
        ids.update(json.dumps(prompt.input_ids[0].tolist()).encode() + b"\n")
    settings = {
        "target": args.target,
        "target_weights": target.record().weights_fingerprint,
        "heads": str(Path(args.heads).resolve()),
        "method": head_config["method"],
        "tree": tree,
        "draft_vocab": args.draft_vocab,
        "prompts": {
            "source": args.prompts,
            "category": args.category,
            "num_prompts": len(prompts),
            "chat_template": templated,
            "prompt_tokens": args.prompt_tokens,
            "token_ids_sha256": ids.hexdigest(),
        },
        "max_new_tokens": args.max_new_tokens,
        "sampling": {
            "temperature": args.temperature,
            "top_k": args.top_k,
            "top_p": args.top_p,
            "seed": args.seed,
        },
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "device": args.device,
        "attn": args.attn,
    }
    if tree == "auto":
        settings["calibration_prompts"] = [p.id for p in held_out]
    return settings
