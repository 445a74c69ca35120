"""`specheads quickstart`: the embedded default, end to end, on any machine.

    tiny target (built once, cached)
      -> heads for each method        specheads train recipes/tiny/<method>.yaml
      -> evaluation on held-out files specheads eval --prompts heldout
      -> one table                    <out>/report.md

Each step is the same command a user would run by hand, so the quickstart doubles as a worked
example. Heads already trained with the same recipe are reused; `--retrain` trains them again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specheads.decode import evaluate
from specheads.heads.checkpoint import CONFIG_FILE
from specheads.train import loop
from specheads.train.config import find_recipe, load_config
from specheads.train.tiny_target import TinyTargetConfig, ensure_tiny_target

METHODS = ("medusa", "eagle", "eagle3")


def recipe_for(method: str) -> Path:
    return find_recipe(f"recipes/tiny/{method}.yaml")


def trained_with(heads_dir: Path, recipe: Path, overrides: list[str]) -> bool:
    """Whether `heads_dir` holds finished heads trained with exactly this recipe and overrides."""
    try:
        saved = json.loads((heads_dir / CONFIG_FILE).read_text())["training"]
    except (OSError, ValueError, KeyError):
        return False
    wanted = load_config(recipe, overrides).to_dict()
    return all(saved.get(k) == v for k, v in wanted.items())


def train_heads(method: str, target: Path, out: Path, args: argparse.Namespace) -> Path:
    heads_dir = out / method
    recipe = recipe_for(method)
    overrides = [f"target={target}", f"output_dir={heads_dir}", "report_to=none"]
    if args.max_steps:
        overrides += [f"max_steps={args.max_steps}", f"eval_every={args.max_steps}"]
    if args.retrain or not trained_with(heads_dir, recipe, overrides):
        print(f"\n== training {method} heads: specheads train {recipe} {' '.join(overrides)}")
        loop.main([str(recipe), *overrides, *([] if args.progress else ["--no-progress"])])
    else:
        print(f"\n== reusing {method} heads in {heads_dir}")
    return heads_dir


def evaluate_heads(method: str, target: Path, heads_dir: Path, out: Path, args: argparse.Namespace) -> dict:
    eval_dir = out / f"eval-{method}"
    argv = [
        "--target",
        str(target),
        "--heads",
        str(heads_dir),
        "--prompts",
        "heldout",
        "--out",
        str(eval_dir),
    ]
    argv += ["--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens)]
    print(f"\n== evaluating {method}: specheads eval {' '.join(argv)}")
    evaluate.main(argv + ([] if args.progress else ["--no-progress"]))
    return json.loads((eval_dir / evaluate.RESULTS_FILE).read_text())


def table(results: dict[str, dict]) -> str:
    lines = [
        "| method | τ (accepted/step) | tokens/s | generate() tokens/s | speedup | identical |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method, r in results.items():
        lines.append(
            f"| {method} | {r['mean_accept_length']:.2f} | {r['tokens_per_second']:.1f} | "
            f"{r['baseline_tokens_per_second']:.1f} | {r['speedup']:.2f}x | {r['identical_to_baseline']} |"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/quickstart"), help="where heads and reports go")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--minutes", type=float, default=TinyTargetConfig.minutes, help="tiny-target budget")
    p.add_argument("--num-prompts", type=int, default=8, help="held-out files to decode")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--tiny-max-files", type=int, default=None, help=argparse.SUPPRESS
    )  # tests: a small corpus
    p.add_argument("--max-steps", type=int, default=None, help="override the recipes' training steps")
    p.add_argument("--retrain", action="store_true", help="train heads even if matching ones exist")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def run(args: argparse.Namespace) -> int:
    cfg = TinyTargetConfig(minutes=args.minutes, max_files=args.tiny_max_files)
    target, meta, reused = ensure_tiny_target(cfg, progress=args.progress)
    print(
        f"== tiny target {'reused' if reused else 'built'}: {target} (held-out loss {meta['heldout_loss']:.3f})"
    )
    results = {}
    for method in args.methods:
        heads_dir = train_heads(method, target, args.out, args)
        results[method] = evaluate_heads(method, target, heads_dir, args.out, args)
    report = (
        f"# specheads quickstart\n\nTarget: {target}\n\n{table(results)}\n\n"
        f"Greedy decoding of {args.num_prompts} held-out standard-library files, {args.max_new_tokens} new "
        "tokens each; τ counts the bonus token; speedup is against the target's own generate() in the same "
        f"run. Per-method details: {args.out}/eval-<method>/report.md\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(report)
    print("\n" + table(results) + f"\n\nreport: {args.out / 'report.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specheads quickstart", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
