"""`specheads quickstart`: the embedded default, end to end, on any machine.

    tiny target (built once, cached)    specheads tiny-target
      -> heads for each method          specheads train recipes/tiny/<method>.yaml
      -> one interleaved comparison     specheads compare --prompts heldout
         with generate() and peers      (prompt lookup; assisted generation with --assisted)
      -> one table and plots            <out>/report.md, <out>/compare/*.png

Each step is the same command a user would run by hand, so the quickstart doubles as a worked
example. The target, the tiny draft and heads already trained with the same recipe are reused;
`--retrain` trains the heads again.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

from specheads.builders.tiny_draft import TinyDraftConfig, ensure_tiny_draft
from specheads.builders.tiny_target import TinyTargetConfig, ensure_tiny_target
from specheads.cli.threads import add_threads_argument
from specheads.decode.drafter_factory import EAGLE_TOTAL_TOKENS, default_tree_name
from specheads.evaluate.compare import command_line, compare_heads
from specheads.evaluate.evaluate import REPORT_FILE
from specheads.evaluate.options import CompareOptions
from specheads.heads.checkpoint import CONFIG_FILE, read_head_config
from specheads.methods import method_named, methods
from specheads.train.loop import train
from specheads.train.optimizers import muon_missing
from specheads.train.recipe import config_from_record, find_recipe, load_config, recipe_values

METHODS = ("medusa", "eagle", "eagle3")
# EAGLE heads decode over a fixed tree, not `--tree auto` (their default in eval and compare): a calibrated
# tree follows the machine's timings, and the quickstart's figures are compared across machines.
FIXED_EAGLE_TREE = f"dynamic-{EAGLE_TOTAL_TOKENS}"


def fixed_tree(heads_dir: Path) -> str:
    """The quickstart's tree for the heads in `heads_dir`: Medusa's default for its head count, else
    FIXED_EAGLE_TREE."""
    config = read_head_config(heads_dir, methods=methods())
    if config["method"] == "medusa":
        return default_tree_name(config["head_config"]["num_heads"])
    return FIXED_EAGLE_TREE


# What the default quickstart gave over fresh builds, per machine (quickstart_reference.json, shipped with the
# package): {"machine", "short", "builds", "settings", "ranges": method -> [τ low, τ high, speedup low, speedup
# high], or None where that machine has not measured the method's recipe as it is now}.
REFERENCE_FILE = "quickstart_reference.json"


def reference_ranges() -> list[dict]:
    """The machines' measured ranges, from the package's REFERENCE_FILE."""
    return json.loads(resources.files("specheads.cli").joinpath(REFERENCE_FILE).read_text())["machines"]


MEASURED_SPREAD = reference_ranges()
# the settings the ranges were measured at (the defaults)
SPREAD_SETTINGS = ("minutes", "tiny_max_files", "max_steps", "num_prompts", "max_new_tokens")


def recipe_for(method: str) -> Path:
    return find_recipe(f"recipes/tiny/{method}.yaml")


def trained_with(heads_dir: Path, recipe: Path, overrides: list[str]) -> bool:
    """Whether `heads_dir` holds finished heads trained with exactly this recipe and overrides."""
    try:
        training = json.loads((heads_dir / CONFIG_FILE).read_text())["training"]
        saved = config_from_record(training, methods=methods())
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return saved == load_config(recipe, overrides, methods=methods())


def without_muon(method: str, recipe: Path, overrides: list[str]) -> list[str]:
    """`overrides`, plus optimizer=adamw where the recipe asks for Muon and this torch has none (torch < 2.9):
    the quickstart runs on any torch the package accepts, and says what it changed. The recipe is read
    unchecked: load_config refuses optimizer=muon on such a torch."""
    why = muon_missing()
    if not why or recipe_values(recipe, overrides, methods=methods()).get("optimizer") != "muon":
        return overrides
    print(f"\n== {method}: {why}; training with optimizer=adamw (the measured ranges assume Muon)")
    return [*overrides, "optimizer=adamw"]


def train_heads(method: str, target: Path, out: Path, args: argparse.Namespace) -> Path:
    heads_dir = out / method
    recipe = recipe_for(method)
    overrides = [f"target={target}", f"output_dir={heads_dir}", "report_to=none"]
    if args.max_steps:
        overrides += [f"max_steps={args.max_steps}", f"eval_every={args.max_steps}"]
    overrides = without_muon(method, recipe, overrides)
    if args.retrain or not trained_with(heads_dir, recipe, overrides):
        print(f"\n== training {method} heads: specheads train {recipe} {' '.join(overrides)} --overwrite")
        # overwrite: quickstart owns its folders (a retrain replaces what was there)
        cfg = load_config(recipe, overrides, methods=methods())
        train(cfg, method_named(cfg.method), progress=args.progress, overwrite=True)
    else:
        print(f"\n== reusing {method} heads in {heads_dir}")
    return heads_dir


def draft_model(target: Path, args: argparse.Namespace) -> Path:
    """The tiny assistant model for the assisted-generation peer (built once, cached)."""
    cfg = TinyDraftConfig(steps=args.max_steps) if args.max_steps else TinyDraftConfig()
    path, meta, reused = ensure_tiny_draft(target, cfg, progress=args.progress)
    print(
        f"\n== tiny draft {'reused' if reused else 'built'}: {path} (held-out loss {meta['heldout_loss']:.3f})"
    )
    return path


def compare_all(target: Path, heads_dirs: list[Path], out: Path, args: argparse.Namespace) -> dict:
    """Every method's heads beside generate() and the peers, interleaved per prompt, in one run."""
    peers = ["generate", "prompt-lookup", *(["assisted"] if args.assisted else [])]
    options = CompareOptions(
        target=str(target),
        heads=[str(h) for h in heads_dirs],
        prompts="heldout",
        peers=",".join(peers),
        out=out / "compare",
        overwrite=True,  # quickstart owns its folders
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        tree=[fixed_tree(h) for h in heads_dirs],
        draft_model=str(draft_model(target, args)) if args.assisted else None,
        no_progress=not args.progress,
        threads=args.threads,  # written into the printed command that reproduces the comparison
    )
    print(f"\n== comparing: {command_line(options, peers)}")
    return compare_heads(options, methods())


def table(methods: list[dict]) -> str:
    lines = [
        "| method | τ (accepted/step) | tokens/s | speedup vs generate() | identical to generate() |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in methods:
        lines.append(
            f"| {m['name']} | {m['mean_accept_length']:.2f} | {m['tokens_per_second']:.1f} | "
            f"{m['speedup']:.2f}x | {m['identical_to_baseline']} |"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/quickstart"), help="where heads and reports go")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument(
        "--assisted",
        action="store_true",
        help="also compare transformers' assisted generation with a tiny draft model (built once, ~2 min)",
    )
    p.add_argument("--minutes", type=float, default=TinyTargetConfig.minutes, help="tiny-target budget")
    p.add_argument("--num-prompts", type=int, default=8, help="held-out files to decode")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--tiny-max-files", type=int, default=None, help=argparse.SUPPRESS
    )  # tests: a small corpus
    p.add_argument("--max-steps", type=int, default=None, help="override the recipes' training steps")
    p.add_argument("--retrain", action="store_true", help="train heads even if matching ones exist")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    add_threads_argument(p)


def spread(methods: list[dict], args: argparse.Namespace) -> str:
    """The report's paragraph on which figures vary between machines, and by how much."""
    text = (
        "## Which figures vary between machines\n\n"
        "Identity with generate() does not vary: every method must reproduce the target's greedy output on "
        "any machine. τ and speedup do. The tiny target is trained here, and its weights depend on the order "
        "in which the CPU's kernels sum (thread count, instruction set), so two machines get two targets and "
        "two sets of heads. Speedup also moves with the machine's load, since this is wall-clock time. "
    )
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    defaults = defaults.parse_args([])
    if any(getattr(args, key) != getattr(defaults, key) for key in SPREAD_SETTINGS):
        return text + "This run changed the default settings, so the measured ranges below do not apply.\n"
    machines = MEASURED_SPREAD
    lines = [
        f"Over {sum(m['builds'] for m in machines)} fresh builds at the default settings, on "
        f"{len(machines)} machines:\n",
        *[f"- {m['short']}: {m['builds']} builds ({m['machine']}; {m['settings']})" for m in machines],
        "",
        "| method | τ here | "
        + " | ".join(f"τ measured, {m['short']}" for m in machines)
        + " | speedup here | "
        + " | ".join(f"speedup measured, {m['short']}" for m in machines)
        + " |",
        "| --- " * (3 + 2 * len(machines)) + "|",
    ]
    for m in methods:
        # a machine without a range for a method has not measured today's recipe for it: "–" there
        ranges = [machine["ranges"].get(m["name"]) for machine in machines]
        if not any(ranges):
            continue
        tau, sp = m["mean_accept_length"], m["speedup"]
        inside = any(r[0] - 0.005 <= tau <= r[1] + 0.005 for r in ranges if r)
        taus = " | ".join(f"{r[0]:.2f}-{r[1]:.2f}" if r else "–" for r in ranges)
        speeds = " | ".join(f"{r[2]:.2f}-{r[3]:.2f}x" if r else "–" for r in ranges)
        flag = "" if inside else " (outside every machine's)"
        lines.append(f"| {m['name']} | {tau:.2f}{flag} | {taus} | {sp:.2f}x | {speeds} |")
    return text + "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    cfg = TinyTargetConfig(minutes=args.minutes, max_files=args.tiny_max_files)
    target, meta, reused = ensure_tiny_target(cfg, progress=args.progress)
    print(
        f"== tiny target {'reused' if reused else 'built'}: {target} (held-out loss {meta['heldout_loss']:.3f})"
    )
    heads_dirs = [train_heads(method, target, args.out, args) for method in args.methods]
    results = compare_all(target, heads_dirs, args.out, args)
    report = (
        f"# specheads quickstart\n\nTarget: {target}\n\n{table(results['methods'])}\n\n"
        f"Greedy decoding of {args.num_prompts} held-out standard-library files, {args.max_new_tokens} new "
        "tokens each, every method interleaved per prompt with the target's own generate() in one run; "
        "τ counts the bonus token. Per-category tables, acceptance per position, engine metrics and "
        f"plots: {args.out / 'compare' / REPORT_FILE}\n\n{spread(results['methods'], args)}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / REPORT_FILE).write_text(report)
    print("\n" + table(results["methods"]) + f"\n\nreport: {args.out / REPORT_FILE}")
    return 0
