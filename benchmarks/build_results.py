"""Build docs/results.md, the current results, from the run records in benchmarks/records/.

    python -m benchmarks.build_results            # writes docs/results.md
    python -m benchmarks.build_results --check    # exits 1 if docs/results.md is not what the records give

One table per target, each naming the records it reads, the machine, and the command that reproduces it.
Every figure is computed here from the records' JSON (or, for the Xeon quickstart builds, from the reports
`specheads quickstart` printed), so the page cannot drift from them: tests/test_results_page.py rebuilds it
and compares it byte for byte.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path too: the repository root

from benchmarks.records import RECORDS, paired, read_json, record_dir

ROOT = RECORDS.parents[1]
PAGE = ROOT / "docs" / "results.md"

METHOD_NAMES = {
    "generate": "`generate()`",
    "prompt-lookup": "prompt lookup (transformers, 10 tokens)",
    "medusa": "Medusa-1, 4 heads (`medusa-63`)",
    "eagle": "EAGLE-2 (`dynamic-32`)",
    "eagle3": "EAGLE-3 (`dynamic-32`)",
}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def link(path: Path) -> str:
    """A Markdown link from docs/results.md to a record's folder."""
    return f"[{rel(path)}/](../{rel(path)}/)"


def spread(values: list[float], digits: int = 3) -> str:
    """mean [min-max] (n), or the one value (1)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (1)"
    return f"{statistics.fmean(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}] ({len(values)})"


def span(values: list[float], digits: int = 2, unit: str = "") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}{unit}" if lo == hi else f"{lo:.{digits}f}{unit}-{hi:.{digits}f}{unit}"


def verdict(p: dict) -> str:
    """A paired comparison (records.paired) in words: the difference, its 95% interval, the prompts ahead."""
    return f"{p['diff']:+.1%} ({p['lo']:+.1%} to {p['hi']:+.1%}), ahead on {p['ahead']} prompts of {p['n_prompts']}"


# -- SmolLM2-135M-Instruct: specheads against each method's reference trainer --------------------------------


def eagle3_row() -> tuple[list[str], list[str]]:
    """EAGLE-3 against NVIDIA Model Optimizer: five seeds a side, all 80 MT-Bench first turns."""
    folder = record_dir("eagle3-smollm2", "init", latest=True)
    rec = read_json(folder / "runs.json")
    ours = [r["mean_accept_length"] for r in rec["runs"].values()]
    identical = {r["identical_to_baseline"] for r in rec["runs"].values()}
    theirs = list(rec["modelopt"].values())
    row = [
        "EAGLE-3",
        "NVIDIA Model Optimizer 0.47.0 (its `examples/speculative_decoding` recipe, lr 2e-3, 10% warm-up)",
        "200 steps of 8 over 1,600 distilled answers (the recipe's budget); 80 MT-Bench first turns, 64 new tokens, "
        "`dynamic-16`",
        spread(theirs),
        spread(ours),
        f"**{verdict(rec['over_modelopt'])}**; every output equals `generate()`'s ({', '.join(sorted(identical))})",
    ]
    notes = [
        f"EAGLE-3: {link(folder)} (ours, `recipes/smollm2-135m/eagle3.yaml` as it ships) and "
        f"{link(record_dir('eagle3-smollm2', 'mt80'))} (Model Optimizer, each seed trained side by side with "
        "ours). Machine: 2-core Intel Xeon (AVX512-BF16, AMX-BF16) for seeds 0-1 and Model Optimizer's five, "
        "2-core AMD EPYC Zen 4 for our seeds 2-4; fp32 decoding, one thread a process. Reproduce, for each seed S "
        "(DATA: the recipe's distilled data, made by the command in its header; P: the 80 first turns, "
        '`python -c "from pathlib import Path; from benchmarks.bench_trainers_jobs import eval_prompts; '
        "eval_prompts('smollm2', Path('mt80'), 80)\"`):",
        "",
        "  ```bash",
        "  bash benchmarks/records/eagle3-smollm2/2026-12-05-side-by-side/pair.sh W DATA S S ours-t15  "
        "# Model Optimizer and ours, side by side",
        '  specheads train recipes/smollm2-135m/eagle3.yaml "data=[DATA]" seed=S output_dir=W/ours-sS --threads 1',
        "  specheads eval --target smollm2 --heads W/ours-sS --prompts P --tree dynamic-16 --dtype float32 "
        "--num-prompts 80 --max-new-tokens 64 --threads 1 --out W/eval80-ours-sS",
        "  ```",
    ]
    return row, notes


def bench_row(topic: str, slug: str, method: str, steps: int, peer_label: str, budget: str, command: str):
    """A row of the trainer comparison (benchmarks/bench_trainers.py): ours (the recipe, `specheads`) against
    the peer's own trainer at one budget, from a record's bench_trainers.json."""
    folder = record_dir(topic, slug, latest=True)
    rec = read_json(folder / "bench_trainers.json")
    at = [r for r in rec["rows"] if r["method"] == method and r["budget"]["steps"] == steps]
    ours = [r for r in at if r["trainer"] == "specheads"]
    theirs = [r for r in at if not r["trainer"].startswith("specheads")]
    identical = {r["identical"] for r in ours + theirs}
    machine = rec["machine"]
    row = [
        method,
        peer_label,
        budget,
        spread([r["tau"] for r in theirs]),
        spread([r["tau"] for r in ours]),
        f"**{verdict(paired(ours, theirs))}**; every output equals `generate()`'s ({', '.join(sorted(identical))})",
    ]
    notes = [
        f"{method}: {link(folder)}. Machine: {machine['cpu_count']}-core {machine['processor']}, fp32, "
        f"OMP_NUM_THREADS={machine['OMP_NUM_THREADS']}, Python {machine['python']}. Reproduce:",
        "",
        "  ```bash",
        f"  python -m benchmarks.bench_trainers {command}",
        "  ```",
    ]
    return row, notes


def smollm2_section() -> list[str]:
    rows = [
        eagle3_row(),
        bench_row(
            "medusa-smollm2",
            "curve",
            "Medusa",
            24,
            "medusa-llm 0.1 (`train.py`, its README's settings)",
            "3 heads a side, 24 steps of 32 rows over 192 distilled answers; 32 MT-Bench first turns, 64 new tokens, `medusa-31`",
            "--target smollm2 --methods medusa --medusa-rows 192 --medusa-epochs 4 --answer-tokens 96 "
            "--max-length 256 --seeds 0,1,2 --peer-seeds 0,1,2 --medusa-lrs 1e-3 --eval-prompts 32 "
            "--eval-new-tokens 64",
        ),
        bench_row(
            "eagle-smollm2",
            "eval32",
            "EAGLE",
            168,
            "eagle-llm 1.2.1 (`ge_data` + `main.py`, lr 1e-3)",
            "168 steps of 4 over 30 distilled answers; 32 MT-Bench first turns, 64 new tokens, `dynamic-16`",
            "--target smollm2 --methods eagle --rows 32 --eagle-epochs 21 --eagle-lrs 1e-3 --seeds 0,1 "
            "--answer-tokens 96 --max-length 256 --eagle-tree dynamic-16 --eval-prompts 32 --eval-new-tokens 64",
        ),
    ]
    lines = [
        "## SmolLM2-135M-Instruct: specheads against each method's reference trainer",
        "",
        "The same heads trained by specheads' recipe and by the method's reference trainer, unedited, at the same "
        "budget (rows, steps and batch), and decoded by one decoder with the same tree on the same prompts. τ is "
        "the mean over runs [lowest-highest] (runs); the last column compares the two prompt by prompt: ours' τ "
        "over the peer's, less 1, with a 95% interval from a bootstrap over the prompts and each side's runs "
        "(`benchmarks/bench_trainers_paired.py`).",
        "",
        "| method | reference trainer | budget and prompts | reference τ | specheads τ | specheads over the reference |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row, _ in rows]
    lines.append("")
    for _, notes in rows:
        lines += ["- " + notes[0], *notes[1:], ""]
    return lines


# -- The tiny target: the quickstart, per CPU ------------------------------------------------------------------

OVERALL = re.compile(
    r"^\| (?P<method>[\w-]+) \| \d+ \| (?P<tau>[\d.]+) \|.*\| (?P<speedup>[\d.]+)x \| (?P<identical>\d+/\d+) \|$"
)


def compare_overall(report: Path) -> dict[str, dict]:
    """method -> {tau, speedup, identical} from the Overall table of a `specheads compare` report."""
    found = {}
    for line in report.read_text().splitlines():
        m = OVERALL.match(line)
        if m and m["method"] not in found:
            found[m["method"]] = {
                "tau": float(m["tau"]),
                "speedup": float(m["speedup"]),
                "identical": m["identical"],
            }
    return found


def quickstart_zen5() -> tuple[str, dict[str, dict], str]:
    folder = record_dir("quickstart", "zen5", latest=True)
    rec = read_json(folder / "builds.json")
    builds = "; ".join(f"{b['name']}: {b['settings']}" for b in rec["builds"])
    about = f"{rec['machine']}; {len(rec['builds'])} fresh builds, {rec['date']} ({builds})"
    return about, rec["methods"], link(folder)


def quickstart_xeon() -> tuple[str, dict[str, dict], str]:
    folder = record_dir("quickstart", "xeon", latest=True)
    reports = ["build1-omp2-compare.md", "build2-omp1-compare.md", "build3-omp1-avx2-compare.md"]
    per_build = [compare_overall(folder / name) for name in reports]
    methods = {
        m: {k: [b[m][k] for b in per_build] for k in ("tau", "speedup", "identical")} for m in per_build[0]
    }
    about = (
        "2-core Intel Xeon (AVX-512), Python 3.11.7, torch 2.13.0+cpu; 3 fresh builds, 2026-11-26 "
        "(OMP_NUM_THREADS=2; =1; =1 with AVX2 kernels, ATEN_CPU_CAPABILITY=avx2; a benchmark on the other core). "
        "EAGLE and EAGLE-3 were then trained with AdamW: their recipes now train with Muon, so their rows are "
        "left out"
    )
    return about, {m: v for m, v in methods.items() if m not in ("eagle", "eagle3")}, link(folder)


def quickstart_section() -> list[str]:
    lines = [
        "## The embedded tiny target: `specheads quickstart`, per CPU",
        "",
        "What the default quickstart gives on a fresh clone (a 4-layer target trained on the spot, Medusa, EAGLE and "
        "EAGLE-3 heads from `recipes/tiny/`, one `specheads compare`): CPU, fp32, batch 1, greedy; 8 held-out "
        "standard-library files, at most 128 new tokens each; every method interleaved per prompt with the "
        "target's own `generate()` in one run. The target's weights depend on the order the CPU's kernels sum in, "
        "so each build may train another target: the ranges are over fresh builds, each from an empty cache. "
        "Reproduce on a fresh clone:",
        "",
        "```bash",
        'pip install "torch==2.13.0" -e ".[dev]" && specheads quickstart',
        "```",
        "",
    ]
    for title, (about, methods, where) in (
        ("AMD EPYC Zen 5", quickstart_zen5()),
        ("Intel Xeon", quickstart_xeon()),
    ):
        lines += [
            f"### {title}",
            "",
            f"{about} ({where}).",
            "",
            "| method | τ | speedup over `generate()` | identical to `generate()` |",
            "| --- | --- | --- | --- |",
        ]
        for method, m in methods.items():
            same = sorted(set(m["identical"]))
            lines.append(
                f"| {METHOD_NAMES[method]} | {span(m['tau'])} | {span(m['speedup'], unit='x')} | "
                f"{' / '.join(same)} in every build |"
            )
        lines.append("")
    return lines


def build() -> str:
    lines = [
        "# Results",
        "",
        "The current figures, built from the run records in `benchmarks/records/` by "
        "`python -m benchmarks.build_results` (do not edit this page by hand). τ is the mean accepted length: the "
        "tokens each target forward yields (accepted draft tokens plus the target's own). Each record's README "
        "says what was run, on which machine, and how to run it again.",
        "",
        *smollm2_section(),
        *quickstart_section(),
    ]
    while lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=PAGE, help="the page to write (default docs/results.md)")
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = p.parse_args(argv)
    page = build()
    if args.check:
        current = args.out.read_text() if args.out.exists() else None
        if current != page:
            print(
                f"{args.out} is not what the records give: run python -m benchmarks.build_results",
                file=sys.stderr,
            )
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    print(f"wrote {rel(args.out) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
