"""Side by side with the peers' own trainers on the tiny target, and SmolLM2 for EAGLE-3: tau for the
same budget.

    nice -n 15 env OMP_NUM_THREADS=1 python benchmarks/bench_trainers.py --overwrite \
        --medusa-ablations "warmup 10%,data labels,decay 1"

For EAGLE (ours: `specheads train recipes/tiny/eagle.yaml` vs eagle-llm 1.2.1's ge_data + main.py),
Medusa (ours: recipes/tiny/medusa.yaml vs medusa-llm 0.1's train.py) and EAGLE-3 (ours:
recipes/tiny/eagle3.yaml vs NVIDIA Model Optimizer 0.47.0's examples/speculative_decoding recipe and HF
Trainer), on the embedded tiny target:

data     one-turn conversations (--rows 16 for EAGLE, --medusa-rows 128 for Medusa, the first N of the same
         list): a prompt of P tokens from a window of the tiny target's TRAINING files
         (stdlib_rows(heldout=False); never the held-out files the evaluation reads) and, as the answer,
         the target's own greedy continuation of it (A new tokens). The peers read them in ShareGPT's
         format (their Vicuna template around them); ours reads the same rows as {"messages": [...]}
         (the target's own chat template, loss on the assistant turns, as theirs).
budget   the peer's: eagle-llm's main.py runs 21 epochs (hard-coded) over the 95% of its files it keeps for
         training, at --bs 4 (its default): ours gets batch 4 and the same optimizer steps (21 x
         ceil(n_train / 4)). Its saved states at smaller epoch counts (--eagle-epochs) are the smaller
         budgets of the learning curve; ours trains afresh at each budget. Medusa: train.py with its
         README's settings (batch 8, gradient accumulation 4, lr 1e-3, warmup ratio 0.1, cosine, 3 heads of
         1 layer) for E epochs (--medusa-epochs); ours with batch 8, 3 heads, and the same optimizer steps
         and rows a step (medusa_budget). Ours keeps its recipe's schedule (warm-up 20 steps, cosine to a
         tenth), labels (the target's distribution) and head decay (0.8) unless an ablation says otherwise.
runs     one run per seed: ours at each of --seeds (its `seed`), medusa-llm at each of --peer-seeds (its
         --seed); eagle-llm once (its main.py seeds nothing of its own). The table gives tau's mean
         [min-max] over a line's runs and their number; a verdict says "wins"/"LOSES" only when the ranges
         do not overlap (one run a side: "leads"/"trails", no verdict). The ranges speak for the seeds on
         one set of prompts: a second line compares the two prompt by prompt (greedy decoding is lossless:
         the same text, the steps apart), the prompts each is ahead on and a 95% bootstrap interval of the
         difference over prompts and seeds (benchmarks/bench_trainers_paired.py).
ablation --medusa-ablations: ours at the largest Medusa budget with one (or several, '+'-joined) of
         medusa-llm's settings in place of our recipe's (MEDUSA_ABLATIONS: its warm-up ratio, its
         unweighted heads, its text labels), at every seed: what each difference buys in tau. --medusa-lrs
         runs medusa-llm at other --learning_rate values too; set beside ours' `lr X` ablations, the report
         adds a verdict at the same rate.
decode   each checkpoint through `specheads import-heads` (the peers') and `specheads eval` on the tiny
         target's held-out prompts (--prompts heldout, --eval-prompts of them), the same tree for both; tau
         and the greedy identity to generate() (results.json's N/N) come from eval.
measured training wall time (the whole trainer process: imports, data features, training, save; for
         eagle-llm also its two stages apart), the process's peak RSS (os.wait4's rusage for ours,
         getrusage in trainer_run.py for the peers), target tokens seen / wall second, and the load average
         when each run started (the machine is shared: wall times are only comparable within a run).

What the peers cannot do here (recorded in the JSON and the table): CUDA, bf16/tf32 (fp32 on the CPU),
wandb, several GPUs (one process: Medusa's README runs 4 GPUs x 8 x accumulation 4), a 2048-token
context (the tiny target is trained at 256: model_max_length 256), and the shims of
tests/consumers/trainer_run.py. Their tokenizer view of the target (`peer_target`): the same weights and
ids, with Llama's conventions their Vicuna masking counts on (BOS added, `</s>` the EOS token, an unk
token for medusa's pad).

EAGLE-3  modelopt runs in its own env (tests/consumers/modelopt_env.py: its transformers 5.14.1) through
         tests/consumers/modelopt_train.py: calibrate_draft_vocab, main.py's recipe + Trainer, export; its
         export through `import-heads --format eagle3`. It reads the rows as {"messages"} in the target's own
         chat template, as ours does (the same tokens seen). Budget (eagle3_budget): --eagle3-rows,
         --eagle3-epochs (its num_train_epochs), --eagle3-batch for both, its last short batch dropped (its
         recipe's dataloader_drop_last); ours at the same optimizer steps and batch. Both draft over the same
         number of tokens (our recipe's 2048, or the rows' distinct tokens when fewer: all its calibration can
         fill) from the same target layers (HF 1, 2, 3). --modelopt-variants: its recipe as it is
         ("defaults") and with some of our settings (MODELOPT_VARIANTS), each at every --peer-seeds (its
         training.seed). The verdict adds whether ours clears the best peer's tau by 5% (GOALS).

--target smollm2 runs every comparison on SmolLM2-135M-Instruct (README "A real target"): the rows are the
         target's own greedy answers (--answer-tokens at most) to the first --rows (--eagle3-rows,
         --medusa-rows) of the project's seed prompts, in its chat template; ours trains
         recipes/smollm2-135m/{eagle,eagle3,medusa}.yaml (every row: no held-out share), modelopt fuses the
         same layers (HF 2, 15, 27: its own default there) over the same draft-vocabulary size; medusa-llm
         and eagle-llm read the rows in their Vicuna template through a Vicuna view of the target
         (peer_target), as on the tiny target, since their masking cannot read ChatML. That view's index
         names an `lm_head.weight` (the tied embedding, in a file of its own), which eagle-llm reads by name.
         eagle-llm's heads are decoded with the rotary base its cnets.py uses, 10000, not SmolLM2's 100000
         (eagle_llm_release_config). tau is `specheads eval` on --eval-prompts MT-Bench questions (32 unless
         given), one a category in turn.

--methods picks what runs; the other methods' rows are carried from --report's JSON, each with the command
that measured it. Writes REPORT/bench_trainers.json and REPORT/bench_trainers.md (the table) after every
run, REPORT/learning_curve.png at the end (--report, default runs/bench-trainers/report/; a kept record copies
them to benchmarks/records/TOPIC/DATE-SLUG/; --render redraws both from the JSON); the checkpoints and logs stay in --out (runs/bench-trainers).

Beside it: bench_trainers_jobs.py (budgets, data, running and evaluating one side), bench_trainers_eagle.py
(eagle-llm's run and its saved states decoded), bench_trainers_medusa.py (medusa-llm's run and the Medusa
ablations), bench_trainers_modelopt.py (Model Optimizer's job and the EAGLE-3 settings),
bench_trainers_report.py (table and plot), bench_trainers_args.py (the command line).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from functools import partial
from pathlib import Path

# Run by path (python benchmarks/X.py) as well as with -m: the repository root, for `benchmarks`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_trainers_args
from benchmarks.bench_trainers_eagle import (
    EAGLE_ABLATIONS,
    PEER_CHANGES,
    add_eagle_llm_rows,
    eagle_llm_changes,
)
from benchmarks.bench_trainers_jobs import (
    ROOT,
    chat_conversations,
    eagle_budget,
    eval_prompts,
    evaluate,
    load_average,
    make_conversations,
    mean_tokens,
    medusa_budget,
    message_rows,
    peer_target,
    recipe_path,
    row_result,
    sharegpt_rows,
    train_ours,
    vicuna_text,
)
from benchmarks.bench_trainers_medusa import (
    MEDUSA_ABLATIONS,
    ablation_overrides,
    medusa_llm_changes,
    medusa_llm_row,
)
from benchmarks.bench_trainers_modelopt import (
    MODELOPT,
    distinct_chat_tokens,
    eagle3_ablation,
    eagle3_budget,
    joined_overrides,
    modelopt_changes,
    modelopt_row,
    modelopt_variant,
    recipe_eagle3,
)
from benchmarks.bench_trainers_report import plot, render, render_table, report_json
from specheads.core.machine import processor_name

CONSUMERS = ROOT / "tests" / "consumers"

# what ours changes of each recipe beside what train_ours adds by target and device (its "changes")
OUR_CHANGES = {
    "eagle": ["data, max_steps, batch_size for the budget"],
    "medusa": [
        "data, max_steps, batch_size, grad_accum for the budget",
        "num_heads=3 (the peer's; the recipe has 4) so both decode with the same tree",
    ],
    "eagle3": ["data, max_steps, batch_size for the budget"],
}


# ours in offline mode (--ours-offline): `specheads cache` then `train mode=offline`, timed together
# (bench_trainers_jobs.train_ours); the cache in the recipe's default dtype (bf16), as a user builds it
OFFLINE = {"mode": "offline"}


def run_eagle(args, ctx: dict) -> list[dict]:
    """eagle-llm at each of --eagle-lrs (all budgets from one run), then ours at each budget and seed and, at
    the largest budget, ours with each of --eagle-ablations; --ours-first runs ours before eagle-llm."""
    n, rows = len(ctx["conversations"]), ctx["rows"]
    epochs = [int(e) for e in args.eagle_epochs.split(",")]
    ablations = [a for a in args.eagle_ablations.split(",") if a]

    def peer() -> None:
        for lr in floats(args.eagle_lrs):
            add_eagle_llm_rows(lr, epochs, args, ctx)

    def ours() -> None:
        for e in epochs:
            budget = eagle_budget(n, e)
            print(f"ours eagle {e} epochs ({budget['steps']} steps x {budget['batch']})", flush=True)
            for seed in ints(args.seeds):
                largest = e == max(epochs)
                if not (args.ablations_only and ablations and largest):
                    add_recipe_rows("eagle", budget, {}, args.eagle_tree, args, ctx, seed)
                for variant in ablations if largest else ():
                    extra = joined_overrides(variant, EAGLE_ABLATIONS, "--eagle-ablations", budget)
                    rows.append(ours_row("eagle", budget, extra, args.eagle_tree, args, ctx, seed, variant))

    in_order(args, peer, ours)
    return rows


def in_order(args, peer, ours) -> None:
    """peer() then ours(), or ours() first with --ours-first: two benches side by side, one with the flag, then
    give each trainer its turn on the machine the other bench leaves quieter or busier."""
    for run in (ours, peer) if args.ours_first else (peer, ours):
        run()


def ours_row(
    method: str,
    budget: dict,
    extra: dict,
    tree: str,
    args,
    ctx: dict,
    seed: int = 0,
    variant: str = "",
    changes: list[str] | None = None,
) -> dict:
    """Train ours at `budget` (recipe overrides `extra`, the schedule scaled to the budget, `seed`), decode
    with `tree`, and give its table row; `variant` names an ablation (its overrides in `extra`)."""
    out = args.out
    extra = {"eval_batches": args.our_eval_batches, "seed": seed, **extra}  # an ablation may set its seeds
    name = f"ours-{method}-e{budget['epochs']}-s{seed}" + (f"-{variant}" if variant else "")
    load = load_average()
    got = train_ours(method, ctx["rows_path"], budget, out / name, extra, args.target, args.device)
    ev = evaluate(Path(got["heads"]), tree, out / f"eval-{name}", args.eval_prompts, args.eval_new_tokens,
                  args.target, ctx["eval_source"], args.device)  # fmt: skip
    label = {"eagle": "EAGLE", "medusa": "Medusa", "eagle3": "EAGLE-3"}[method]
    trainer = "specheads" + (f" ({variant})" if variant else "")
    changes = list(changes or OUR_CHANGES[method]) + got["changes"]
    row = row_result(label, trainer, budget, ctx["chat_tokens"], ev, got["wall_s"], got["peak_rss_mib"],
                     changes, overrides=got["overrides"], seed=seed, load_average=load,
                     peak_accelerator_mib=got["peak_accelerator_mib"], loop_s=got["loop_s"],
                     cache_s=got["cache_s"])  # fmt: skip
    print(f"  {trainer} seed {seed}: tau {row['tau']:.3f} {row['identical']}", flush=True)
    return row


def add_recipe_rows(method, budget, extra, tree, args, ctx, seed, changes=None) -> None:
    """Ours with the recipe (`extra` the budget's overrides) and, with --ours-offline, the same in offline mode,
    each appended to ctx["rows"] as it is measured (ReportedRows: the report rewritten after each)."""
    for mode, variant in [({}, "")] + [(OFFLINE, "offline")] * args.ours_offline:
        ctx["rows"].append(
            ours_row(method, budget, {**extra, **mode}, tree, args, ctx, seed, variant, changes=changes)
        )


def run_medusa(args, ctx: dict) -> list[dict]:
    """At each budget, largest first, seed by seed: medusa-llm (--peer-seeds), ours (--seeds) and, at the
    largest budget, ours with each of --medusa-ablations (medusa-llm's settings); so a run cut short still
    holds paired runs of the comparison that matters most. --ours-first puts ours before medusa-llm."""
    rows, n = ctx["rows"], len(ctx["conversations"])
    epochs = sorted(ints(args.medusa_epochs), reverse=True)
    variants = [v for v in args.medusa_ablations.split(",") if v]

    def peer(budget: dict, seed: int) -> None:
        for lr in floats(args.medusa_lrs) if seed in ints(args.peer_seeds) else ():
            rows.append(medusa_llm_row(budget, seed, args, ctx, lr))

    def ours(budget: dict, seed: int, largest: bool) -> None:
        if seed not in ints(args.seeds):
            return
        if not (args.ablations_only and variants and largest):
            add_recipe_rows("medusa", budget, {"num_heads": 3}, args.medusa_tree, args, ctx, seed)
        for variant in variants if largest else ():
            extra = {"num_heads": 3, **ablation_overrides(variant, budget)}
            rows.append(ours_row("medusa", budget, extra, args.medusa_tree, args, ctx, seed, variant))

    for e in epochs:
        budget = medusa_budget(n, e)
        print(
            f"medusa {e} epochs: {budget['steps']} steps x {budget['batch']} x {budget['grad_accum']}",
            flush=True,
        )
        for seed in sorted(set(ints(args.peer_seeds)) | set(ints(args.seeds))):
            in_order(
                args,
                partial(peer, budget, seed),
                partial(ours, budget, seed, e == epochs[0]),
            )
    return rows


def run_eagle3(args, ctx: dict) -> list[dict]:
    """At each budget, largest first, seed by seed: modelopt (each of --modelopt-variants, --peer-seeds as
    its training.seed) and ours (--seeds), both drafting over the same number of tokens (draft_vocab);
    --ours-first puts ours before modelopt."""
    rows, n, recipe_vocab = ctx["rows"], len(ctx["conversations"]), ctx["eagle3_vocab"]
    vocab = min(recipe_vocab, distinct_chat_tokens(ctx["target"], ctx["conversations"]))
    ours_extra, ours_changes = {}, []
    if vocab < recipe_vocab:  # calibrate_frequent_vocab needs that many distinct tokens in the rows
        ours_extra = {"draft_vocab_size": vocab}
        ours_changes = [f"draft_vocab_size={vocab} (the rows' distinct tokens, all modelopt can calibrate; "
                        f"the recipe's {recipe_vocab})"]  # fmt: skip
    changes = OUR_CHANGES["eagle3"] + ours_changes
    variants = args.modelopt_variants.split(",")
    ablations = [a for a in args.eagle3_ablations.split(",") if a]
    epochs = sorted(ints(args.eagle3_epochs), reverse=True)

    def peer(budget: dict, seed: int) -> None:
        for variant in variants if seed in ints(args.peer_seeds) else ():
            rows.append(modelopt_row(budget, seed, variant, vocab, args, ctx))

    def ours(budget: dict, seed: int, largest: bool) -> None:
        if seed not in ints(args.seeds):
            return
        if not (args.ablations_only and ablations and largest):
            add_recipe_rows("eagle3", budget, ours_extra, args.eagle_tree, args, ctx, seed, changes)
        for variant in ablations if largest else ():
            extra = {**ours_extra, **eagle3_ablation(variant, budget, seed)}
            rows.append(
                ours_row("eagle3", budget, extra, args.eagle_tree, args, ctx, seed, variant, changes=changes)
            )

    for e in epochs:
        budget = eagle3_budget(n, e, args.eagle3_batch)
        print(
            f"eagle3 {e} epochs: {budget['steps']} steps x {budget['batch']}, draft vocab {vocab}", flush=True
        )
        for seed in sorted(set(ints(args.peer_seeds)) | set(ints(args.seeds))):
            in_order(
                args,
                partial(peer, budget, seed),
                partial(ours, budget, seed, e == epochs[0]),
            )
    return rows


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


class ReportedRows(list):
    """The rows measured so far; each append rewrites the report (`write(rows)`), so a run cut short
    leaves what it measured."""

    def __init__(self, write):
        super().__init__()
        self.write = write

    def append(self, row: dict) -> None:
        super().append(row)
        self.write(self)


def data_context(target: Path, conversations: list, out: Path, peer_dir: Path | None, env: Path) -> dict:
    """The rows in both formats under `out` and what the runs read about them (the peers' Vicuna view only
    with `peer_dir`: the tiny target's)."""
    from transformers import AutoTokenizer

    out.mkdir()
    rows_path = out / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in message_rows(conversations)))
    (out / "sharegpt.json").write_text(json.dumps(sharegpt_rows(conversations), indent=1))
    ours_tok = AutoTokenizer.from_pretrained(target)
    chats = [ours_tok.apply_chat_template(r["messages"], tokenize=False) for r in message_rows(conversations)]
    lengths = [len(ours_tok(c, add_special_tokens=False).input_ids) for c in chats]
    return {
        "env": env,
        "target": target,
        "peer_target": peer_dir,
        "conversations": conversations,
        "sharegpt": sharegpt_rows(conversations),
        "rows_path": rows_path,
        "hidden": json.loads((target / "config.json").read_text())["hidden_size"],
        "chat_tokens": sum(lengths) / len(lengths),
        "longest_chat_tokens": max(lengths),  # modelopt pads every row to its training_seq_len: fit to this
        "vicuna_tokens": None
        if peer_dir is None
        else mean_tokens(
            AutoTokenizer.from_pretrained(peer_dir), [vicuna_text(p, a) for p, a in conversations]
        ),
    }


def carried_rows(report: Path, methods: list[str]) -> tuple[list[dict], dict]:
    """The rows of the methods not run this time from the report already there, each marked with the
    command and load average of the run that made it (so one table can hold both)."""
    path = report / "bench_trainers.json"
    if not path.is_file():
        return [], {}
    old = json.loads(path.read_text())
    names = {"eagle": "EAGLE", "medusa": "Medusa", "eagle3": "EAGLE-3"}
    keep = {names[m] for m in names if m not in methods}
    rows = [r for r in old["rows"] if r["method"] in keep]
    origin = {"command": old.get("command"), "load_average": old.get("load_average"),
              "total_wall_s": old.get("total_wall_s"), "settings": old.get("settings")}  # fmt: skip
    for r in rows:
        r.setdefault("carried_from", origin)  # a row carried twice keeps the run that measured it
    return rows, {r["method"]: r["carried_from"] for r in rows}


def arg_parser() -> argparse.ArgumentParser:
    return bench_trainers_args.arg_parser(__doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    args = bench_trainers_args.with_target_defaults(arg_parser().parse_args(argv))
    if args.render:
        render(args.report, args.merge)
        return 0

    sys.path.insert(0, str(CONSUMERS))
    import modelopt_env

    from specheads.builders.named_targets import resolve_target
    from specheads.builders.tiny_target import ensure_tiny_target

    import consumer_env

    methods = args.methods.split(",")
    if args.device == "cuda":
        import torch

        if methods != ["eagle3"]:
            raise SystemExit(
                "--device cuda: only --methods eagle3 (the eagle-llm and medusa-llm shims run on the CPU)"
            )
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device here")
    for v in filter(None, args.medusa_ablations.split(",")):
        ablation_overrides(v, medusa_budget(1, 1))  # a bad name stops here, before any work
    for v in args.modelopt_variants.split(","):
        modelopt_variant(v, eagle3_budget(1, 1, 1))
    for v in filter(None, args.eagle3_ablations.split(",")):
        eagle3_ablation(v, eagle3_budget(1, 1, 1))
    for v in filter(None, args.eagle_ablations.split(",")):
        joined_overrides(v, EAGLE_ABLATIONS, "--eagle-ablations", eagle_budget(1, 1))
    if args.out.exists():
        if not args.overwrite:
            raise SystemExit(f"{args.out} exists: --overwrite to replace it")
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    started, load_start = time.time(), load_average()
    env = consumer_env.env_dir()  # eagle-llm's and medusa-llm's (EAGLE-3's peer has its own: modelopt_env)
    if {"eagle", "medusa"} & set(methods) and not (env / "PINS").is_file():
        consumer_env.build(env)
    n = max(args.rows if "eagle" in methods else 0, args.medusa_rows if "medusa" in methods else 0,
            args.eagle3_rows if "eagle3" in methods else 0)  # fmt: skip
    if args.target == "tiny":
        target, _, _ = ensure_tiny_target(progress=False)
        print(f"data: {n} conversations from the training files", flush=True)
        conversations = make_conversations(target, n, args.prompt_tokens, args.answer_tokens, args.seed)
        peer_dir = peer_target(target, args.out / "peer-target", args.max_length)
    else:
        target = Path(resolve_target(args.target))
        print(f"data: the target's answers to {n} seed prompts", flush=True)
        conversations = chat_conversations(target, n, args.answer_tokens, args.seed, 256 if args.device == "cuda" else 16,
                                           args.device)  # fmt: skip
        # medusa-llm's and eagle-llm's Vicuna view of the chat target (their template, not its ChatML)
        peer_dir = (peer_target(target, args.out / "peer-target", args.max_length)
                    if {"eagle", "medusa"} & set(methods) else None)  # fmt: skip
    eval_source = eval_prompts(args.target, args.out, args.eval_prompts)
    # our EAGLE-3 recipe's target layers and draft-vocabulary size, which modelopt is given too
    layers, eagle3_vocab = recipe_eagle3(recipe_path(args.target, "eagle3"))
    its_changes = modelopt_changes(json.loads((target / "config.json").read_text()), layers, args.device)
    carried, carried_from = carried_rows(args.report, methods)
    data: dict = {}

    def write(rows: list[dict], final: bool = False) -> None:
        loads = [r["load_average"][0] for r in rows if r.get("load_average") and not r.get("carried_from")]
        report = {
            "command": " ".join(sys.argv),
            "finished": final,
            "machine": {"cpu_count": os.cpu_count(), "processor": processor_name(),
                        "python": platform.python_version(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
            "load_average": {"start": load_start, "now": load_average(),
                             "1min_at_each_run": {"min": min(loads, default=None), "max": max(loads, default=None),
                                                  "mean": sum(loads) / len(loads) if loads else None}},
            "runs": "one per row; the table's tau is the mean over the rows of a trainer and budget, [min-max], n",
            "total_wall_s": round(time.time() - started, 1),
            "settings": {k: str(v) for k, v in vars(args).items()},
            "data": data,
            "carried_from": carried_from,
            "peer_changes": {**PEER_CHANGES, "eagle-llm": eagle_llm_changes(args.target),
                             "medusa-llm": medusa_llm_changes(args.max_length, args.target),
                             MODELOPT: its_changes},
            "our_changes": OUR_CHANGES,
            "ablations": {k: v(medusa_budget(args.medusa_rows, max(ints(args.medusa_epochs))))
                          for k, v in MEDUSA_ABLATIONS.items()},
            "rows": list(rows),
        }  # fmt: skip
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / "bench_trainers.json").write_text(report_json(report))
        (args.report / "bench_trainers.md").write_text(render_table(rows))
        if final:
            plot(rows, args.report / "learning_curve.png", args.target)

    results = ReportedRows(write)
    results.extend(carried)
    runs = (("eagle", args.rows, run_eagle), ("medusa", args.medusa_rows, run_medusa),
            ("eagle3", args.eagle3_rows, run_eagle3))  # fmt: skip
    for method, rows, run in runs:
        if method in methods:
            ctx = data_context(target, conversations[:rows], args.out / f"data-{method}", peer_dir, env)
            if method == "eagle3":
                ctx["modelopt_env"] = modelopt_env.ensure_env()
            data[method] = {"conversations": rows, "prompt_tokens": args.prompt_tokens,
                            "answer_tokens": args.answer_tokens, "mean_row_tokens_ours": ctx["chat_tokens"],
                            "mean_row_tokens_peers": ctx["vicuna_tokens"]}  # fmt: skip
            run(args, {**ctx, "rows": results, "eval_source": eval_source, "eagle3_layers": layers,
                       "eagle3_vocab": eagle3_vocab, "modelopt_changes": its_changes})  # fmt: skip
    write(results, final=True)
    print(render_table(results))
    print(f"wrote {args.report}/bench_trainers.json, bench_trainers.md, learning_curve.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
