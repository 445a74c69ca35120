"""Gather `draft_head_init=target` on five seeds into runs.json.gz: seeds 0 and 1 from 2026-12-06
(`../2026-12-06-vocab/runs.json.gz`), seeds 2 to 4 decoded here, each on all 80 MT-Bench first turns, set against the
recipe's own five heads and Model Optimizer's five (`../2026-12-06-mt80/runs.json.gz`), prompt by prompt: all five a side,
and each seed against the recipe's head of the same seed.

    python benchmarks/records/eagle3-smollm2/2026-12-06-init/assemble.py OUT.json RUN_DIR [SEEDS]

Run from the repository root. RUN_DIR holds `eval80-ours-init-sS/` and `ours-init-sS/` (with
train_summary.json) for each seed S of SEEDS past 1 (commands in README.md). SEEDS: comma-separated, 0,1,2,3,4
unless given; the recipe's heads are taken on the same seeds, Model Optimizer's on all five.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import mt80_line as line
from benchmarks.records import mt80_runs, paired, read_json, write_json
from benchmarks.records import variant_record as record

HERE = Path(__file__).parent
mt80 = mt80_runs()

SEEDS = (0, 1, 2, 3, 4)
EARLIER = read_json(HERE.parent / "2026-12-06-vocab" / "runs.json")["draft_head_init target"]["runs"]


def assemble(run_dir: Path, seeds=SEEDS) -> dict:
    """The runs, each seed against the recipe's same seed, and all of them against the recipe's same seeds and
    Model Optimizer's five (and, for reference, the recipe's same seeds and all five against Model Optimizer's)."""
    runs = {
        f"ours-init-s{s}": EARLIER.get(f"ours-init-s{s}") or record(run_dir, f"ours-init-s{s}") for s in seeds
    }
    mine = [{"per_prompt": r["per_prompt"]} for r in runs.values()]
    recipe, modelopt = [f"ours-t15-s{s}" for s in seeds], [f"modelopt-s{s}" for s in SEEDS]
    return {
        "seeds": list(seeds),
        "runs": runs,
        "recipe": {name: mt80[name]["mt80"]["tau"] for name in recipe},
        "recipe_depths": {name: mt80[name]["mt80"]["accept_rate_per_depth"][:3] for name in recipe},
        "modelopt": {name: mt80[name]["mt80"]["tau"] for name in modelopt},
        "per_seed_over_recipe": {s: paired([m], line([f"ours-t15-s{s}"])) for s, m in zip(seeds, mine)},
        "over_recipe": paired(mine, line(recipe)),
        "over_modelopt": paired(mine, line(modelopt)),
        "recipe_same_seeds_over_modelopt": paired(line(recipe), line(modelopt)),
        "recipe_over_modelopt": paired(line([f"ours-t15-s{s}" for s in SEEDS]), line(modelopt)),
    }


def show(result: dict) -> None:
    for name, run in result["runs"].items():
        depths = [round(a, 3) for a in run["accept_rate_per_depth"][:3]]
        print(name, round(run["mean_accept_length"], 4), run["identical_to_baseline"], depths)
    print("recipe", {k: round(v, 4) for k, v in result["recipe"].items()})
    print("recipe depths", {k: [round(a, 3) for a in v] for k, v in result["recipe_depths"].items()})
    print("modelopt", {k: round(v, 4) for k, v in result["modelopt"].items()})
    for s, p in result["per_seed_over_recipe"].items():
        print(
            f"seed {s} over the recipe's",
            {k: round(v, 4) if isinstance(v, float) else v for k, v in p.items()},
        )
    for key in ("over_recipe", "over_modelopt", "recipe_same_seeds_over_modelopt", "recipe_over_modelopt"):
        print(key, {k: round(v, 4) if isinstance(v, float) else v for k, v in result[key].items()})


if __name__ == "__main__":
    out, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    seeds = tuple(int(s) for s in sys.argv[3].split(",")) if len(sys.argv) > 3 else SEEDS
    result = assemble(run_dir, seeds)
    write_json(out, result)
    show(result)
