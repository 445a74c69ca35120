"""`specheads compare`: our heads beside the target's own `generate()` and transformers' speculative paths.

    specheads compare --target runs/target --heads runs/medusa runs/eagle runs/eagle3 \\
        --prompts mt-bench --draft-model runs/draft --out runs/compare

In one run on one machine, with the same prompts and settings, every method decodes every prompt:
the peers (evaluate/peers.py: `generate`, the baseline; `prompt-lookup`; `assisted`, with --draft-model)
and our tree decoder with each --heads checkpoint (its drafter from decode.drafter_factory.drafter_for). The
methods are interleaved per prompt, in an order rotated by one from prompt to prompt (prompt 1: A B C,
prompt 2: B C A, prompt 3: C A B, ...), so slow drift (clocks, caches, other processes) favours none;
results.json records the order. Each call is timed end to end, prefill included, and greedy outputs are
compared with the baseline's token for token.

Prompts (--prompts):
    mt-bench, spec-bench   the question sets, found as PROMPT_SETS in $SPECHEADS_DATA or in the copies
                           shipped with the package (core/prompt_sets/); or give the .jsonl path
    *.jsonl                MT-Bench / Spec-Bench questions. Every turn is asked (--max-turns cuts them):
                           turn k goes to each method after that method's own answers to turns 1..k-1,
                           rendered with the target's chat template, as Spec-Bench does
    heldout, *.json        held-out source files (evaluate.prompts.read_prompts): the first
                           --prompt-tokens tokens of each, as raw text

`--tree auto` (for every heads directory, or some: one name each) calibrates a heads directory's tree as
`specheads eval --tree auto` does (evaluate/calibrate.py), on the first turns of the last
--calibration-prompts prompts, which no method is then compared on; the chosen tree is kept in
progress.jsonl, so that a resumed run decodes with it, and recorded in the method's settings.

Writes to --out: results.json (one entry per method: DESIGN.md's figures, report.py's draft figures,
per category, per prompt; the run order, settings, versions and the command), report.md (tables overall
and per category, acceptance per position, the plots), the PNG plots (evaluate/plots.py), and
answers/<method>.jsonl in Spec-Bench's answer-file format, for its evaluation/speed.py.

Several processes (`accelerate launch --num_processes N -m specheads compare ...`; `processes`) share the
conversations out as `specheads eval` shares its prompts (evaluate/sharing.py): process r compares
conversations r, r + N, ..., each in the method order its number gives it, and keeps them in its own
progress-rank{r}.jsonl; process 0 merges them in order and writes the one set of outputs, which says what
one process's says of every token, τ, acceptance and identity (timings aside). With --tree auto, process 0
calibrates and every process decodes with its trees. `--device-map auto` spreads the target over the GPUs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specheads.builders.named_targets import resolve_target
from specheads.core.atomic import write_text
from specheads.core.processes import Processes
from specheads.core.run_folder import claim_results_folder
from specheads.core.target import FrozenTarget
from specheads.decode.calibrate import CalibrationSettings
from specheads.decode.decoder import timed
from specheads.decode.drafter_factory import drafter_for
from specheads.decode.step import decoding_attention
from specheads.evaluate.answers import ANSWERS_DIR, answer_file, write_answers
from specheads.evaluate.calibrate import hold_out, holds_out, max_tree_depth
from specheads.evaluate.compare_records import (
    Run,
    conversation_record,
    method_entry,
    records_for,
    run_from_dict,
)
from specheads.evaluate.conversations import (
    Conversation,
    TurnSettings,
    first_turns,
    prompt_set_path,
    read_conversations,
    render_turn,
    select_prompts,
)
from specheads.evaluate.eval_drafters import trees_for
from specheads.evaluate.evaluate import REPORT_FILE, RESULTS_FILE
from specheads.evaluate.options import CompareOptions
from specheads.evaluate.peers import (
    BASELINE,
    PEERS,
    AssistedPeer,
    CalibratedHeads,
    GeneratePeer,
    HeadsMethod,
    Method,
    PromptLookupPeer,
    calibrate_heads,
    head_names,
    load_draft_model,
)
from specheads.evaluate.plots import PLOTS, check_matplotlib, write_plots
from specheads.evaluate.progress import (
    stop_on_sigterm,
    stopped_message,
)
from specheads.evaluate.prompts import (
    Prompt,
    chat_template_record,
    check_prompt_lengths,
    note_raw_questions,
)
from specheads.evaluate.report import (
    DEFINITIONS,
    DRAFT_DEFINITIONS,
    render_comparison,
    run_environment,
)
from specheads.evaluate.sharing import (
    merged_records,
    placed_target,
    process_share,
    results_folder,
)
from specheads.heads import load_heads, read_head_config
from specheads.heads.checkpoint import draft_vocab_ids, heads_adapter
from specheads.heads.method import Method as MethodEntry

# -- running ----------------------------------------------------------------------------------------


def rotated(names: list[str], i: int) -> list[str]:
    """The order for prompt i: `names` rotated left by i (every method takes every slot in turn)."""
    shift = i % len(names)
    return names[shift:] + names[:shift]


def run_conversation(
    method: Method, conversation: Conversation, tokenizer, settings: TurnSettings, device, slot: int
) -> Run:
    """Every turn of `conversation` with `method`, each turn after the method's own earlier answers."""
    run = Run(slot)
    for _ in conversation.turns:
        ids = render_turn(tokenizer, conversation, run.answers, settings.templated, settings.prompt_tokens)
        needed = ids.shape[1] + settings.max_new_tokens + settings.depth
        if settings.limit is not None and needed > settings.limit:
            raise ValueError(
                f"prompt {conversation.id!r}, turn {len(run.answers) + 1}, is {ids.shape[1]} tokens and needs "
                f"{needed} positions, past the target's max_position_embeddings={settings.limit}"
            )
        ids = ids.to(device)
        decoded, seconds = timed(lambda ids=ids: method.generate(ids, settings.max_new_tokens), device)
        run.prompt_tokens.append(ids.shape[1])
        run.decoded.append(decoded)
        run.seconds.append(seconds)
        run.answers.append(tokenizer.decode(decoded.tokens, skip_special_tokens=True).strip())
    return run


def compare(
    methods: dict[str, Method],
    conversations: list[Conversation],
    tokenizer,
    settings: TurnSettings,
    device: torch.device,
    warmup: int = 1,
    progress: bool = True,
    done: list[dict[str, Any]] | None = None,
    on_conversation: Callable[[dict[str, Any]], None] | None = None,
    indices: list[int] | None = None,
) -> tuple[dict[str, list[Run]], list[list[str]]]:
    """Every method on every conversation, interleaved: (runs per method, the order per prompt).

    Before timing, every method decodes `warmup` conversations untimed (allocation, kernel selection).
    `done`: the first conversations, finished by an earlier run (`conversation_record`'s form,
    evaluate/progress.py); decoding goes on after them in the same order. `on_conversation` is called with
    each conversation's record once every method has finished it. `indices`: each conversation's number in
    the whole run, which decides its method order (a process of several compares every N-th; None: 0, 1, ...).
    """
    indices = list(range(len(conversations))) if indices is None else list(indices)
    names = list(methods)
    runs: dict[str, list[Run]] = {name: [] for name in names}
    orders = []
    for record in done or []:
        orders.append(record["order"])
        for name in names:
            runs[name].append(run_from_dict(record["runs"][name]))
    if len(orders) >= len(conversations):
        return {name: r[: len(conversations)] for name, r in runs.items()}, orders[: len(conversations)]
    for i in range(warmup):
        for name in names:
            run_conversation(
                methods[name], conversations[i % len(conversations)], tokenizer, settings, device, 0
            )
    bar = tqdm(conversations, desc="compare", unit="prompt", disable=not progress, initial=len(orders))
    for i, conversation in enumerate(conversations):
        if i < len(orders):
            continue
        order = rotated(names, indices[i])
        finished = {}
        for slot, name in enumerate(order):
            finished[name] = run_conversation(methods[name], conversation, tokenizer, settings, device, slot)
        for name in names:
            runs[name].append(finished[name])
        orders.append(order)
        if on_conversation is not None:
            on_conversation(conversation_record(conversation, order, finished))
        bar.update(1)
    bar.close()
    return runs, orders


# -- the command ------------------------------------------------------------------------------------


def peers_of(options: CompareOptions) -> list[str]:
    """The peers to run, the baseline first; raises for unknown names or a missing --draft-model."""
    if options.peers is None:
        wanted = ["prompt-lookup", *(["assisted"] if options.draft_model else [])]
    else:
        wanted = [p.strip() for p in options.peers.split(",") if p.strip()]
    unknown = sorted(set(wanted) - set(PEERS))
    if unknown:
        raise ValueError(f"--peers: unknown {unknown}; known: {', '.join(PEERS)}")
    if "assisted" in wanted and not options.draft_model:
        raise ValueError("--peers assisted needs --draft-model DIR (a small model of the target's tokenizer)")
    if options.draft_model and "assisted" not in wanted:
        raise ValueError(
            f"--draft-model is only used by the assisted peer, and --peers {options.peers!r} has none"
        )
    return [BASELINE, *(p for p in PEERS if p in wanted and p != BASELINE)]


def check_options(options: CompareOptions) -> None:
    for flag in ("max_new_tokens", "prompt_tokens", "prompt_lookup_tokens", "assistant_tokens"):
        if getattr(options, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(options, flag)}")
    for flag in ("num_prompts", "max_turns", "threads", "prompt_lookup_ngram", "draft_vocab"):
        if getattr(options, flag) is not None and getattr(options, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(options, flag)}")
    if options.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {options.warmup}")
    if not 0 <= options.assistant_confidence <= 1:
        raise ValueError(f"--assistant-confidence must be in [0, 1], got {options.assistant_confidence}")
    if options.tree is not None and len(options.tree) not in (1, len(options.heads)):
        raise ValueError(
            f"--tree takes one name or one per --heads directory ({len(options.heads)}), got {options.tree}"
        )
    if options.calibration_prompts is not None and (
        options.tree and not tree_auto(options) or options.calibration_prompts < 1
    ):
        raise ValueError(
            f"--calibration-prompts must be >= 1, with --tree auto; got {options.calibration_prompts}"
        )
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {options.device}: no CUDA device is available here")
    if options.device_map not in (None, "auto"):
        raise ValueError(
            f"--device-map {options.device_map!r}: auto, or leave it out (the whole target on --device)"
        )
    if options.out.exists() and not options.out.is_dir():
        raise NotADirectoryError(f"--out {options.out} exists and is not a directory")
    if not options.no_plots:
        check_matplotlib()


def build_methods(
    options: CompareOptions,
    target: FrozenTarget,
    peers: list[str],
    configs: list[dict],
    trees: list,
    table: Mapping[str, MethodEntry],
) -> dict[str, tuple[str, Method]]:
    """name -> (method kind, method): the peers, then each heads directory with its tree (`trees_for`), its
    heads read by their entry in `table` (the method table)."""
    methods: dict[str, tuple[str, Method]] = {BASELINE: (BASELINE, GeneratePeer(target))}
    if "prompt-lookup" in peers:
        methods["prompt-lookup"] = (
            "prompt-lookup",
            PromptLookupPeer(target, options.prompt_lookup_tokens, options.prompt_lookup_ngram),
        )
    if "assisted" in peers:
        draft, draft_tokenizer = load_draft_model(
            options.draft_model, target.dtype, target.device, options.attn
        )
        peer = AssistedPeer(
            target,
            draft,
            draft_tokenizer,
            options.assistant_tokens,
            options.assistant_confidence,
            options.draft_model,
        )
        methods["assisted"] = ("assisted", peer)
    for name, path, tree in zip(head_names(configs, options.heads), options.heads, trees):
        heads, config = load_heads(
            path,
            target,
            device=target.device,
            dtype=target.dtype,
            allow_target_mismatch=options.allow_target_mismatch,
            methods=table,
        )
        record = {"path": str(Path(path).resolve()), "head_config": config["head_config"]}
        if (adapter := heads_adapter(path)) is not None:
            record["adapter"] = str(adapter.resolve())  # merged into the target every method decodes
        vocab = None
        if options.draft_vocab is not None and not table[config["method"]].draft_vocab:  # else its own
            vocab = draft_vocab_ids(path, options.draft_vocab, target.vocab_size)
            record["draft_vocab"] = options.draft_vocab
        if tree == "auto":  # calibrated once the progress file is open (`calibrate_heads`)
            depth = max_tree_depth(heads, config, calibration_settings(options), methods=table)
            calibrated = CalibratedHeads(
                target, heads, config, record, depth, table, vocab, reuse=not options.recalibrate
            )
            methods[name] = (config["method"], calibrated)
        else:
            drafter, tree_record = drafter_for(heads, config, target, tree, vocab, methods=table)
            methods[name] = (config["method"], HeadsMethod(target, drafter, tree_record, record))
    return methods


def calibration_settings(options: CompareOptions) -> CalibrationSettings:
    """How `--tree auto` calibrates: greedy continuations as long as a compared turn's."""
    return CalibrationSettings(max_new_tokens=options.max_new_tokens)


def tree_auto(options: CompareOptions) -> bool:
    """Whether any --heads directory's tree is `auto` (calibration prompts are then held out)."""
    return bool(options.heads) and "auto" in (options.tree or [])


def command_line(options: CompareOptions, peers: list[str]) -> str:
    """The command with every option spelled out, so that it reproduces this run."""
    parts = [
        "specheads",
        "compare",
        "--target",
        options.target,
        *(["--heads", *options.heads] if options.heads else []),
    ]
    parts += ["--prompts", options.prompts, "--out", str(options.out), "--peers", ",".join(peers)]
    parts += ["--max-new-tokens", str(options.max_new_tokens), "--prompt-tokens", str(options.prompt_tokens)]
    parts += ["--prompt-lookup-tokens", str(options.prompt_lookup_tokens)]
    parts += ["--assistant-tokens", str(options.assistant_tokens)]
    parts += ["--assistant-confidence", str(options.assistant_confidence), "--warmup", str(options.warmup)]
    parts += ["--dtype", options.dtype, "--device", options.device, "--attn", options.attn]
    flags = (
        "draft_model",
        "num_prompts",
        "category",
        "max_turns",
        "threads",
        "prompt_lookup_ngram",
        "draft_vocab",
        "chat_template",
        "device_map",
    )
    for flag in flags:
        if getattr(options, flag) is not None:
            parts += ["--" + flag.replace("_", "-"), str(getattr(options, flag))]
    if options.tree:
        parts += ["--tree", *options.tree]
    if options.calibration_prompts is not None:
        parts += ["--calibration-prompts", str(options.calibration_prompts)]
    if options.enable_thinking is not None:
        parts += ["--enable-thinking", str(options.enable_thinking).lower()]
    for flag in ("skip_long", "no_chat_template", "no_plots", "recalibrate", "trust_remote_code"):
        if getattr(options, flag):
            parts.append("--" + flag.replace("_", "-"))
    return " ".join(shlex.quote(p) for p in parts)


def build_results(
    options: CompareOptions,
    peers: list[str],
    methods: dict[str, tuple[str, Method]],
    runs: dict[str, list[Run]],
    orders: list[list[str]],
    conversations: list[Conversation],
    skipped: list[str],
    target: FrozenTarget,
    templated: bool,
    held_out: list[Prompt] = (),
) -> dict[str, Any]:
    """results.json: one entry per method first, then the run order and what produced them; `held_out`:
    the calibration prompts of `--tree auto` (each calibrated method's settings hold its calibration)."""
    entries = [
        method_entry(
            name,
            kind,
            method,
            records_for(runs[name], runs[BASELINE], conversations, getattr(method, "draft_vocab", None)),
        )
        for name, (kind, method) in methods.items()
    ]
    return {
        "baseline": BASELINE,
        "methods": entries,
        "order": [{"id": c.id, "methods": order} for c, order in zip(conversations, orders)],
        "target": {**target.record().to_dict(), "path": options.target},
        "prompts": {
            "source": options.prompts,
            "path": prompt_set_path(options.prompts),
            "chat_template": templated,
            **chat_template_record(target.tokenizer, options),
            "prompt_tokens": options.prompt_tokens,
            "category": options.category,
            "max_turns": options.max_turns,
            "num_prompts": len(conversations),
            "turns": sum(len(c.turns) for c in conversations),
            "skipped": skipped,
            **({"calibration": [p.id for p in held_out]} if held_out else {}),
        },
        "max_new_tokens": options.max_new_tokens,
        "temperature": 0.0,
        "warmup": options.warmup,
        **run_environment(target, options.attn),
        "command": command_line(options, peers),
        "definitions": {**DEFINITIONS, **DRAFT_DEFINITIONS},
        "answers": {name: answer_file(name) for name in methods},
        "plots": {} if options.no_plots else dict(PLOTS),
    }


def write_outputs(
    out: Path, results: dict[str, Any], runs: dict[str, list[Run]], conversations: list[Conversation]
) -> None:
    """answers/*.jsonl, results.json, the plots, then report.md (which shows them)."""
    write_answers(out, results, runs, conversations)
    write_text(out / RESULTS_FILE, json.dumps(results, indent=1) + "\n")
    if results["plots"]:
        write_plots(results["methods"], out, results["baseline"])
    write_text(out / REPORT_FILE, render_comparison(results))


def compare_heads(
    options: CompareOptions, table: Mapping[str, MethodEntry], processes: Processes | None = None
) -> dict[str, Any]:
    """Check every input, decode every prompt with every method, write results, report, plots and answers
    into `options.out`; returns the results. `table`: the method table, which reads each heads directory.
    `processes`: those sharing the conversations (core/processes.py; None: this one alone); every one
    calls compare_heads with the same options, and every one returns the merged results."""
    procs = processes or Processes()
    check_options(options)
    if options.resume and options.overwrite:
        raise ValueError("--resume goes on from a stopped run, --overwrite starts over: give one of them")
    results_names = (RESULTS_FILE, REPORT_FILE, ANSWERS_DIR, *PLOTS.values())
    claim_results_folder(options.out, results_names, options.overwrite)  # changes nothing
    peers = peers_of(options)
    configs = [
        read_head_config(path, methods=table) for path in options.heads
    ]  # a foreign checkpoint fails before loading
    head_names(configs, options.heads)
    target_path = resolve_target(options.target)  # a named target (tiny, smollm2) is found or built here
    trees = trees_for(options.tree, [c["method"] for c in configs], calibrates=True, methods=table)
    auto = "auto" in trees
    conversations = read_conversations(
        options.prompts,
        target_path,
        options.category,
        None if auto else options.num_prompts,
        options.max_turns,
    )
    if not options.tree and auto and options.calibration_prompts is None:
        if not holds_out(len(conversations), None, options.num_prompts):  # too few to hold some out
            trees, auto = (
                trees_for(None, [c["method"] for c in configs], calibrates=False, methods=table),
                False,
            )
    if options.calibration_prompts is not None and not auto:
        raise ValueError(
            f"--calibration-prompts must be >= 1, with --tree auto; got {options.calibration_prompts}, and no "
            "heads directory's default tree is auto here"
        )
    held_out, conversations = (
        hold_out(conversations, options.calibration_prompts) if auto else ([], conversations)
    )
    conversations = conversations[: options.num_prompts]

    target = placed_target(target_path, options, procs, options.heads)
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ValueError(f"target {options.target!r} has no tokenizer; compare needs one to encode prompts")
    methods = build_methods(options, target, peers, configs, trees, table)
    templated = not options.no_chat_template and getattr(tokenizer, "chat_template", None) is not None
    templated = templated and any(c.chat for c in conversations)
    note_raw_questions(tokenizer, not options.no_chat_template, any(c.chat for c in conversations))
    settings = TurnSettings(
        max_new_tokens=options.max_new_tokens,
        prompt_tokens=options.prompt_tokens,
        templated=templated,
        limit=getattr(target.config, "max_position_embeddings", None),
        depth=max(method.max_depth for _, method in methods.values()),
    )
    conversations, skipped = select_prompts(conversations, tokenizer, settings, options.skip_long)
    held_out = first_turns(held_out, tokenizer, settings)  # what --tree auto calibrates on
    check_prompt_lengths(held_out, target.config, options.max_new_tokens, settings.depth)
    numbers, _ = process_share(len(conversations), 1, procs, what="conversations")
    mine = [conversations[j] for j in numbers]
    header = progress_settings(options, peers, methods, conversations, target, templated, held_out)
    # a second eval or compare on --out stops at once; --overwrite's old results stay until the first record
    with results_folder(options.out, results_names, "compare", header, options, procs) as (progress, keep):
        if progress.done:
            print(f"resuming: {len(progress.done)} of {len(mine)} prompts already done ({progress.path})")
        try:
            # every method, peers and baseline too, with the decoders' attention backends (decode/step.py)
            with stop_on_sigterm(), decoding_attention(target.device):
                if procs.main:  # the others decode with the trees process 0 calibrates
                    calibrate_heads(methods, progress, held_out, calibration_settings(options))
                for key, kept in procs.broadcast(progress.kept).items():
                    if not procs.main:
                        progress.keep(key, kept)
                if not procs.main:
                    calibrate_heads(methods, progress, held_out, calibration_settings(options))
                runs, orders = compare(
                    {name: method for name, (_, method) in methods.items()},
                    mine,
                    tokenizer,
                    settings,
                    target.device,
                    options.warmup,
                    progress=not options.no_progress and procs.main,
                    done=progress.done,
                    on_conversation=keep,
                    indices=numbers,
                )
        except KeyboardInterrupt:
            command = command_line(options, peers)
            print(stopped_message(command, len(progress.done), len(mine), options.out))
            raise
        if procs.world > 1:  # every process's conversations, as their records, in order
            records = merged_records(procs, numbers, progress.done, len(conversations))
            runs, orders = compare(
                {name: method for name, (_, method) in methods.items()}, conversations, tokenizer, settings,
                target.device, done=records,
            )  # fmt: skip
        results = build_results(
            options, peers, methods, runs, orders, conversations, skipped, target, templated, held_out
        )
        if procs.world > 1:
            results["processes"] = procs.world
        if procs.main:
            write_outputs(options.out, results, runs, conversations)
    return results


def progress_settings(
    options: CompareOptions, peers, methods, conversations, target, templated, held_out=()
) -> dict[str, Any]:
    """progress.jsonl's header: every setting that decides the outputs (never timings, warmup, threads).
    A calibrated method's tree is "auto" here; the tree it chose is kept beside (`calibrate_heads`)."""
    settings = {
        "target": options.target,
        "target_weights": target.record().weights_fingerprint,
        "methods": {name: method.settings() for name, (_, method) in methods.items()},
        "peers": peers,
        "heads": [str(Path(p).resolve()) for p in options.heads],
        "draft_model": options.draft_model,
        "prompts": {
            "source": options.prompts,
            "category": options.category,
            "max_turns": options.max_turns,
            "chat_template": templated,
            **chat_template_record(target.tokenizer, options),
            "prompt_tokens": options.prompt_tokens,
            "ids": [c.id for c in conversations],
        },
        "max_new_tokens": options.max_new_tokens,
        "dtype": options.dtype,
        "device": options.device,
        "attn": options.attn,
    }
    if held_out:
        settings["calibration_prompts"] = [p.id for p in held_out]
    return settings
