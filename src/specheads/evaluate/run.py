"""One `specheads eval` run, from its options to results.json: `run_eval(EvalOptions(...), methods())`.

    from specheads.evaluate.options import EvalOptions
    from specheads.evaluate.run import run_eval
    from specheads.methods import methods

    options = EvalOptions(target="tiny", heads="runs/medusa", prompts="heldout", out="runs/eval")
    results = run_eval(options, methods())

Every input is checked, and every model loaded, before `out` is touched: the heads' config and the tree,
the prompts, the target and the heads (which must match it), the prompt lengths, and that `out` can be
written (not a file, not a dangling symlink). Only then is the folder locked (a second eval or compare
on it stops at once, touching nothing), and only then, with `overwrite`, are its old results set aside:
they go once the new run has kept its first record, and come back if it fails before that
(core/run_folder.py: `replacing`). The decoding itself and the records: evaluate/evaluate.py.

Several processes (`accelerate launch --num_processes N -m specheads eval ...`, or torchrun; `processes`)
share the prompts out, data-parallel: process r decodes prompts r, r + N, ... (with `batch_size` B, whole
groups of B: groups r, r + N, ...), each with the order and seed its number gives it in the whole run, and
keeps them in its own progress-rank{r}.jsonl (resumable per process, with the same N). Process 0 merges
the records in order and writes the one results.json and report.md: everything they say of tokens, τ,
acceptance and identity is what one process reports; only the timings differ. With `device_map="auto"`
(`--device-map auto`) the target is spread over the GPUs (each process's share of them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from specheads.builders.named_targets import resolve_target
from specheads.core.atomic import write_text
from specheads.core.processes import Processes
from specheads.core.run_folder import claim_results_folder
from specheads.core.target import FrozenTarget
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.calibrate import CalibrationSettings
from specheads.decode.decoder import SpeculativeDecoder
from specheads.decode.drafter_factory import (
    check_tree_for_method,
    draft_vocab_mask,
    drafter_for,
    tree_by_default,
)
from specheads.decode.sampling import SamplingParams
from specheads.decode.step import decoding_attention
from specheads.evaluate.batched_eval import evaluate_batched
from specheads.evaluate.calibrate import calibrated_once, hold_out, holds_out, max_tree_depth
from specheads.evaluate.evaluate import (
    REPORT_FILE,
    RESULTS_FILE,
    EvalRun,
    evaluate,
    report_text,
    sampling_record,
)
from specheads.evaluate.options import EvalOptions
from specheads.evaluate.progress import (
    stop_on_sigterm,
    stopped_message,
)
from specheads.evaluate.prompts import (
    chat_template_record,
    check_prompt_lengths,
    encode_prompts,
    read_prompts,
)
from specheads.evaluate.report import DEFINITIONS, per_category, run_environment, summarize
from specheads.evaluate.sharing import (
    merged_records,
    placed_target,
    process_share,
    results_folder,
)
from specheads.heads import load_heads, read_head_config
from specheads.heads.checkpoint import draft_vocab_ids, heads_adapter
from specheads.heads.method import Method


def run_eval(
    options: EvalOptions, table: Mapping[str, Method], processes: Processes | None = None
) -> dict[str, Any]:
    """Check every input, decode every prompt both ways, write results.json and report.md into
    `options.out`; returns the results. `table`: the method table (`specheads.methods.methods()`), which
    reads the heads directory. `processes`: those sharing the prompts (core/processes.py; None: this one
    alone); every one calls run_eval with the same options, and every one returns the merged results."""
    procs = processes or Processes()
    check_options(options)
    if options.resume and options.overwrite:
        raise ValueError("--resume goes on from a stopped run, --overwrite starts over: give one of them")
    head_config = read_head_config(
        options.heads, methods=table
    )  # a missing or foreign checkpoint fails before any loading
    calibrates = options.batch_size == 1 and options.temperature == 0
    default_auto = (
        options.tree is None and tree_by_default(head_config["method"], calibrates, methods=table) == "auto"
    )
    if options.calibration_prompts is not None and options.tree is None and not default_auto:
        raise ValueError(
            f"--calibration-prompts must be >= 1, with --tree auto; got {options.calibration_prompts} for "
            f"{head_config['method']} heads, whose default tree here is not auto"
        )
    claim_results_folder(options.out, (RESULTS_FILE, REPORT_FILE), options.overwrite)  # changes nothing
    check_tree_for_method(
        head_config["method"], None if options.tree == "auto" else options.tree, methods=table
    )
    if options.draft_vocab is not None:
        why = table[head_config["method"]].draft_vocab
        if why or options.draft_vocab < 1:
            raise ValueError(
                f"--draft-vocab {options.draft_vocab}: a count >= 1, for heads whose drafter takes one "
                f"({head_config['method']}: {why or 'it does'})"
            )
    target_path = resolve_target(options.target)  # a named target (tiny, smollm2) is found or built here
    texts = read_prompts(options.prompts, target_path, options.category)
    if default_auto and (
        options.calibration_prompts is not None or holds_out(len(texts), None, options.num_prompts)
    ):
        # these heads' default (the method table's default_tree); the command records it
        options = dataclasses.replace(options, tree="auto")
        print(
            f"--tree auto: the default for {head_config['method']} heads (--tree NAME decodes a fixed tree)"
        )
    auto = options.tree == "auto"
    held_out, texts = hold_out(texts, options.calibration_prompts) if auto else ([], texts)
    texts = texts[: options.num_prompts]

    target = placed_target(target_path, options, procs, [options.heads])
    if target.tokenizer is None:
        raise ValueError(f"target {options.target!r} has no tokenizer; eval needs one to encode prompts")
    heads, head_config = load_heads(
        options.heads,
        target,
        device=target.device,
        dtype=target.dtype,
        allow_target_mismatch=options.allow_target_mismatch,
        methods=table,
    )
    chat = not options.no_chat_template
    prompts, templated = encode_prompts(texts, target.tokenizer, chat, options.prompt_tokens)
    vocab = None
    if options.draft_vocab is not None:
        vocab = draft_vocab_ids(options.heads, options.draft_vocab, target.vocab_size)
    if auto:  # evaluate/calibrate.py, once the progress file is open (a resume reuses it)
        held_out, _ = encode_prompts(held_out, target.tokenizer, chat, options.prompt_tokens)
        calibration_settings = CalibrationSettings(max_new_tokens=options.max_new_tokens)
        depth = max_tree_depth(heads, head_config, calibration_settings, methods=table)
        check_prompt_lengths(prompts + held_out, target.config, options.max_new_tokens, depth)
        tree = "auto"
    else:
        drafter, tree = drafter_for(heads, head_config, target, options.tree, vocab, methods=table)
        check_prompt_lengths(prompts, target.config, options.max_new_tokens, tree["depth"])
    numbers, groups = process_share(len(prompts), options.batch_size, procs)
    mine = [prompts[j] for j in numbers]
    settings = progress_settings(options, head_config, target, tree, templated, prompts, held_out)
    results_names = (RESULTS_FILE, REPORT_FILE)
    # a second eval or compare on --out stops at once; --overwrite's old results stay until the first record
    with results_folder(options.out, results_names, "eval", settings, options, procs) as (progress, keep):
        if progress.done:
            print(f"resuming: {len(progress.done)} of {len(mine)} prompts already done ({progress.path})")
        calibration = None
        try:
            # SIGTERM stops as Ctrl-C does (what is finished stays in progress.jsonl); the baseline runs with
            # the decoder's attention backends (decode/step.py)
            with stop_on_sigterm(), decoding_attention(target.device):
                if auto:  # several processes decode with the tree process 0 calibrated

                    def calibrate():
                        return calibrated_once(
                            progress,
                            "calibration",
                            heads,
                            head_config,
                            target,
                            held_out,
                            calibration_settings,
                            vocab,
                            reuse=not options.recalibrate,
                            methods=table,
                        )

                    if procs.main:
                        drafter, tree, calibration = calibrate()
                    calibration = procs.broadcast(calibration)
                    if not procs.main:
                        progress.keep("calibration", calibration)
                        drafter, tree, calibration = calibrate()
                run = EvalRun(
                    warmup=options.warmup,
                    progress=not options.no_progress and procs.main,
                    sampling=sampling_params(options),
                    seed=options.seed,
                    done=progress.done,
                    on_record=keep,
                    draft_vocab=draft_vocab_mask(drafter, target.vocab_size),
                    indices=groups,  # with --batch-size 1, each group is one prompt
                )
                if options.batch_size > 1:
                    decoder = BatchedSpeculativeDecoder(target, drafter)
                    records = evaluate_batched(
                        decoder, target, mine, options.max_new_tokens, options.batch_size, run
                    )
                else:
                    records = evaluate(
                        SpeculativeDecoder(target, drafter), target, mine, options.max_new_tokens, run
                    )
        except KeyboardInterrupt:
            command = command_line(options, "auto" if auto else tree["name"])
            print(stopped_message(command, len(progress.done), len(mine), options.out))
            raise
        records = merged_records(procs, numbers, records, len(prompts))
        results = build_results(
            options, records, head_config, target, tree, templated, calibration, processes=procs.world
        )
        if procs.main:
            write_text(options.out / RESULTS_FILE, json.dumps(results, indent=1) + "\n")
            write_text(options.out / REPORT_FILE, report_text(results))
    return results


# -- checks -----------------------------------------------------------------------------------------


def check_options(options: EvalOptions) -> None:
    """Raise naming the flag for any option out of range, before anything is read or loaded."""
    for flag in ("max_new_tokens", "prompt_tokens"):
        if getattr(options, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(options, flag)}")
    if options.num_prompts is not None and options.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {options.num_prompts}")
    if options.threads is not None and options.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {options.threads}")
    if options.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {options.batch_size}")
    if options.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {options.warmup}")
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {options.device}: no CUDA device is available here")
    if options.device_map not in (None, "auto"):
        raise ValueError(
            f"--device-map {options.device_map!r}: auto, or leave it out (the whole target on --device)"
        )
    if options.calibration_prompts is not None and (
        options.tree not in ("auto", None) or options.calibration_prompts < 1
    ):
        raise ValueError(
            f"--calibration-prompts must be >= 1, with --tree auto; got {options.calibration_prompts}"
        )
    if options.tree == "auto" and (options.batch_size > 1 or options.temperature > 0):
        raise ValueError(
            "--tree auto calibrates greedy decoding one prompt at a time: not with --batch-size > 1 "
            "or --temperature > 0"
        )
    if options.out.exists() and not options.out.is_dir():
        raise NotADirectoryError(f"--out {options.out} exists and is not a directory")
    sampling_params(options)


def sampling_params(options: EvalOptions) -> SamplingParams | None:
    """The settings of `--temperature/--top-k/--top-p`; None for greedy (temperature 0).

    Raises:
        ValueError: for a negative temperature or a bad top-k / top-p (checked at temperature 0 too).
    """
    try:  # temperature 0 is greedy, not a SamplingParams; 1.0 stands in to check top-k / top-p
        params = SamplingParams(options.temperature or 1.0, options.top_k, options.top_p)
    except ValueError as e:
        raise ValueError(f"--temperature / --top-k / --top-p: {e}") from e
    return params if options.temperature > 0 else None


# -- what it writes ---------------------------------------------------------------------------------


def command_line(options: EvalOptions, tree_name: str) -> str:
    """The `specheads eval` command with every option spelled out (the tree too), so it reproduces this run."""
    o = options
    parts = ["specheads", "eval", "--target", o.target, "--heads", o.heads, "--prompts", o.prompts]
    parts += ["--out", str(o.out), "--max-new-tokens", str(o.max_new_tokens)]
    parts += ["--prompt-tokens", str(o.prompt_tokens), "--warmup", str(o.warmup)]
    parts += ["--dtype", o.dtype, "--device", o.device, "--attn", o.attn, "--tree", tree_name]
    parts += ["--temperature", str(o.temperature), "--top-k", str(o.top_k), "--top-p", str(o.top_p)]
    parts += ["--seed", str(o.seed), "--batch-size", str(o.batch_size)]
    for flag, value in (
        ("--device-map", o.device_map),
        ("--threads", o.threads),
        ("--num-prompts", o.num_prompts),
        ("--category", o.category),
        ("--calibration-prompts", o.calibration_prompts),
        ("--draft-vocab", o.draft_vocab),
        ("--chat-template", o.chat_template),
        ("--enable-thinking", None if o.enable_thinking is None else str(o.enable_thinking).lower()),
    ):
        if value is not None:
            parts += [flag, str(value)]
    if o.no_chat_template:
        parts.append("--no-chat-template")
    if o.recalibrate:
        parts.append("--recalibrate")
    if o.trust_remote_code:
        parts.append("--trust-remote-code")
    return " ".join(shlex.quote(p) for p in parts)


def build_results(
    options: EvalOptions,
    records: list[dict[str, Any]],
    head_config: dict[str, Any],
    target: FrozenTarget,
    tree: dict[str, Any],
    templated: bool,
    calibration: dict[str, Any] | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """results.json: the headline figures first, then what produced them, then the per-prompt records
    (`processes`: how many shared them, recorded when more than one)."""
    sampling = sampling_params(options)
    adapter = heads_adapter(options.heads)
    return {
        "method": head_config["method"],
        **summarize(records, tree["depth"]),
        "per_category": per_category(records, tree["depth"]),
        "sampling": sampling_record(sampling, options.seed),
        "tree": tree,
        **({"calibration": calibration} if calibration else {}),
        "heads": {
            "path": str(Path(options.heads).resolve()),
            "method": head_config["method"],
            "head_config": head_config["head_config"],
            "training": head_config.get("training", {}),
            "specheads_version": head_config.get("specheads_version"),
            "adapter": None
            if adapter is None
            else str(adapter.resolve()),  # Medusa-2: merged into the target
            "draft_vocab": options.draft_vocab,  # proposed from the N most frequent labels
        },
        "target": {**target.record().to_dict(), "path": options.target},
        "prompts": {
            "source": options.prompts,
            "chat_template": templated,
            **chat_template_record(target.tokenizer, options),
            "prompt_tokens": options.prompt_tokens,
            "category": options.category,
        },
        "max_new_tokens": options.max_new_tokens,
        "warmup": options.warmup,
        "batch_size": options.batch_size,
        **({"processes": processes} if processes > 1 else {}),
        **run_environment(target, options.attn),
        "command": command_line(options, "auto" if calibration else tree["name"]),
        "definitions": DEFINITIONS,
        "per_prompt": records,
    }


def progress_settings(
    options: EvalOptions, head_config, target, tree, templated, prompts, held_out=()
) -> dict[str, Any]:
    """progress.jsonl's header: every setting that decides the token outputs (never timings, warmup,
    threads), so that a resumed run continues only the same run. `tree` is the tree's record, or "auto":
    the calibrated tree is kept beside the settings (`calibrated_once`), on `held_out` prompts."""
    ids = hashlib.sha256()
    for prompt in prompts:
        ids.update(json.dumps(prompt.input_ids[0].tolist()).encode() + b"\n")
    settings = {
        "target": options.target,
        "target_weights": target.record().weights_fingerprint,
        "heads": str(Path(options.heads).resolve()),
        "method": head_config["method"],
        "tree": tree,
        "draft_vocab": options.draft_vocab,
        "prompts": {
            "source": options.prompts,
            "category": options.category,
            "num_prompts": len(prompts),
            "chat_template": templated,
            **chat_template_record(target.tokenizer, options),
            "prompt_tokens": options.prompt_tokens,
            "token_ids_sha256": ids.hexdigest(),
        },
        "max_new_tokens": options.max_new_tokens,
        "sampling": {
            "temperature": options.temperature,
            "top_k": options.top_k,
            "top_p": options.top_p,
            "seed": options.seed,
        },
        "batch_size": options.batch_size,
        "dtype": options.dtype,
        "device": options.device,
        "attn": options.attn,
    }
    if tree == "auto":
        settings["calibration_prompts"] = [p.id for p in held_out]
    return settings
