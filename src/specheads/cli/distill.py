"""`specheads distill --source ... --target ... --out DIR`: self-distillation, the target regenerates a
dataset's answers (data/distillation.py); a question file (MT-Bench / Spec-Bench's `turns` format)
becomes conversations whose answers the target writes (data/questions.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specheads import data as data_lib
from specheads.builders.named_targets import resolve_target
from specheads.cli.commands import options_from
from specheads.cli.target_flags import add_chat_template_arguments, add_trust_remote_code_argument
from specheads.cli.threads import add_threads_argument
from specheads.core.run_folder import LOCK_FILE, check_writable, clear, hold_folder
from specheads.core.target import FrozenTarget
from specheads.data.chat_masks import read_chat_template, set_chat_template
from specheads.data.distillation import SUMMARY_FILE, DistillConfig, distill
from specheads.data.questions import question_rows, question_source
from specheads.data.server_distill import DEFAULT_CONCURRENCY, ServerTarget
from specheads.train import host_memory
from specheads.train.sources import stdlib_rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DistillConfig()
    p.add_argument(
        "--source",
        required=True,
        help='anything load_rows reads, "stdlib" (text), or a question file in the MT-Bench / Spec-Bench '
        '"turns" format (each question a conversation; its answers the target writes)',
    )
    p.add_argument(
        "--allow-eval-prompts",
        action="store_true",
        help="distil a question file that holds MT-Bench / Spec-Bench questions (forbidden for training: "
        "refused without this flag)",
    )
    p.add_argument("--split", default="train", help="split of a saved DatasetDict or a hub dataset")
    p.add_argument(
        "--target",
        required=True,
        help='HF directory or hub id of the target, or a named one ("tiny", "smollm2")',
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (resumed when it exists)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="0: greedy")
    p.add_argument("--top-p", type=float, default=d.top_p)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="text rows: prompt of a window")
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="the length the rows will train at (the recipe's max_length): longer conversations cannot fit",
    )
    p.add_argument(
        "--skip-long",
        action="store_true",
        help="leave out prompts that cannot fit (counted) instead of refusing the run before generating",
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--chunk-rows", type=int, default=d.chunk_rows, help="prompts per output part")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-rows", type=int, default=None, help="distil only the first N prompts")
    p.add_argument(
        "--cache",
        choices=("static", "dynamic"),
        default=d.cache,
        help="generate()'s KV cache: static is about 2x faster on a CPU (generate() never compiles here: "
        "disable_compile); on an H100 both were as slow, about 0.3 s a step for 264-352 prompts, eight processes "
        "at once (not understood)",
    )
    p.add_argument("--shuffle", action="store_true", help="shuffle the source rows with --seed first")
    p.add_argument(
        "--max-bad-rows",
        type=float,
        default=d.max_bad_rows,
        help="failures allowed: a count (>= 1) or a fraction",
    )
    p.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="URL",
        help="an OpenAI-compatible server serving the target (vLLM, SGLang, transformers serve, ...), e.g. "
        "http://127.0.0.1:8000; repeat it to share the prompts between servers. The target is then not "
        "loaded here, only its tokenizer and configs (data/server_distill.py)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="--server: requests in flight on each server",
    )
    p.add_argument(
        "--served-model",
        default=None,
        help="--server: the name the servers serve the target under, where it is not the target's "
        "path or hub id (a server serving another name is refused)",
    )
    p.add_argument(
        "--request-timeout", type=float, default=600.0, help="--server: seconds to wait for one answer"
    )
    add_chat_template_arguments(p, "the conversations are")
    add_trust_remote_code_argument(p)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i]")
    p.add_argument("--overwrite", action="store_true", help="start over, deleting what --out holds")
    p.add_argument(
        "--keep-host-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="glibc keeps the memory torch frees between generation steps, as in training (train/host_memory.py)",
    )
    p.add_argument("--no-progress", action="store_true")
    add_threads_argument(p)


def chat_settings(tokenizer, template: str, args: argparse.Namespace) -> dict | None:
    """Give the target's tokenizer --chat-template and --enable-thinking; what the distillation records of
    them (None when neither is given: the target's own template, as before these flags)."""
    if tokenizer is None or (not template and args.enable_thinking is None):
        return None
    set_chat_template(tokenizer, template, args.enable_thinking)
    return {"chat_template": tokenizer.chat_template, "enable_thinking": args.enable_thinking}


def run(args: argparse.Namespace) -> int:

    check_writable(args.out)  # before the rows and the target load
    template = read_chat_template(args.chat_template) if args.chat_template else ""
    bad = args.max_bad_rows
    cfg = options_from(
        DistillConfig,
        args,
        long_prompts="skip" if args.skip_long else "refuse",
        max_bad_rows=int(bad) if bad >= 1 and float(bad).is_integer() else bad,
    )
    questions = question_source(args.source)
    if args.source == "stdlib":
        rows = stdlib_rows(heldout=False)
    elif questions is not None:
        rows = question_rows(questions, allow_eval_prompts=args.allow_eval_prompts)
    else:
        rows = data_lib.load_rows(args.source, split=args.split)
    if args.shuffle:
        rows = rows.shuffle(seed=args.seed)
    # a second distill into --out stops at once, naming this one
    with hold_folder(args.out), host_memory.keep_freed_memory(args.keep_host_memory):
        if args.overwrite:
            clear(args.out, [p.name for p in args.out.iterdir() if p.name != LOCK_FILE])
        source = f"{args.source}{' (shuffled)' if args.shuffle else ''}"
        if args.server:
            target = ServerTarget.connect(
                str(resolve_target(args.target)),
                args.server,
                concurrency=args.concurrency,
                served_model=args.served_model,
                timeout=args.request_timeout,
                trust_remote_code=args.trust_remote_code,
            )
            try:
                chat = chat_settings(target.tokenizer, template, args)
                s = distill(
                    rows, target, args.out, cfg, source=source, progress=not args.no_progress, chat=chat
                )
            finally:
                target.close()
        else:
            target = FrozenTarget.from_pretrained(
                resolve_target(args.target), dtype=args.dtype, trust_remote_code=args.trust_remote_code
            )
            target.model.to(args.device)
            chat = chat_settings(target.tokenizer, template, args)
            s = distill(rows, target, args.out, cfg, source=source, progress=not args.no_progress, chat=chat)
    print(
        f"read {s['read']} prompts = written {s['written']} + skipped {s['skipped']} (done before) "
        f"+ failed {s['failed']}; {s['new_tokens']} new tokens in {s['seconds']} s"
    )
    if s["too_long"]:
        longest = max(p["tokens"] for p in s["too_long_prompts"])
        print(
            f"left out {s['too_long']} prompts that cannot fit (--skip-long; the longest needs {longest} tokens)"
        )
    for f in s["failures"][:10]:
        print(f"  failed: prompt {f['index']} ({f['where']}): {f['why'][:200]}")
    print(f"{s['output_rows']} rows in {args.out} (summary: {args.out / SUMMARY_FILE})")
    if s["output_capped"]:
        print(
            f"  {s['output_capped']} of them hold an answer cut off at --max-new-tokens {args.max_new_tokens} "
            '(marked "capped"; training leaves them out unless the recipe sets include_capped: true)'
        )
    return 0
