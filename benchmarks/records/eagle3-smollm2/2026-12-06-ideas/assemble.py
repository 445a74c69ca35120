"""Gather the forty-ninth session's runs into runs.json.gz: five settings of the SmolLM2 EAGLE-3 recipe's heads, each
decoded on all 80 MT-Bench first turns and set against the recipe's own heads of the same seeds and against Model
Optimizer's five (`../2026-12-06-mt80/runs.json.gz`).

    python benchmarks/records/eagle3-smollm2/2026-12-06-ideas/assemble.py OUT.json RUN_DIR

Run from the repository root. RUN_DIR holds `eval80-NAME/` for each NAME of VARIANTS (`specheads eval` as in
README.md), and `NAME/` with train_summary.json for the trained ones.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, "scripts")
from bench_trainers_paired import eval_record, paired  # noqa: E402

HERE = Path(__file__).parent
# change -> {seed: the head's folder name in RUN_DIR}
VARIANTS = {
    "logits x0.77": {0: "ours-s0-x0.77"},
    "logits x1.3": {0: "ours-s0-x1.3"},
    "average 160+200": {0: "ours-s0-avg160", 1: "ours-s1-avg160"},
    "decay 1.0": {0: "ours-d1-s0", 1: "ours-d1-s1"},
    "muon_dtype float32": {0: "ours-fp32-s0", 1: "ours-fp32-s1"},
}
s48 = json.loads((HERE.parent / "2026-12-06-mt80" / "runs.json.gz").read_text())["runs"]


def line(names: list[str]) -> list[dict]:
    """Runs of 2026-12-06-mt80 with their steps on all 80 prompts (the bench's 32 and the other 48)."""
    return [{"per_prompt": {**s48[n]["per_prompt_32"], **s48[n]["per_prompt_48"]}} for n in names]


def record(run_dir: Path, name: str) -> dict:
    """The head's eval (bench_trainers_paired.eval_record), with its mean step where it was trained here."""
    ev = eval_record(run_dir / f"eval80-{name}")
    assert len(ev["per_prompt"]) == 80 and " --tree dynamic-16 " in ev["command"], name
    summary = run_dir / name / "train_summary.json"
    return {
        **ev,
        **({"step_seconds": json.loads(summary.read_text())["step_seconds"]} if summary.exists() else {}),
    }


def assemble(variants: dict[str, dict[int, str]], run_dir: Path) -> dict:
    """change -> its runs, the recipe's τ on the same seeds, and paired() over the recipe and Model Optimizer."""
    result = {}
    for change, heads in variants.items():
        runs = {seed: record(run_dir, name) for seed, name in heads.items()}
        mine = [{"per_prompt": r["per_prompt"]} for r in runs.values()]
        result[change] = {
            "runs": {heads[seed]: r for seed, r in runs.items()},
            "recipe_same_seeds": {f"ours-t15-s{s}": s48[f"ours-t15-s{s}"]["mt80"]["tau"] for s in heads},
            "over_recipe": paired(mine, line([f"ours-t15-s{s}" for s in heads])),
            "over_modelopt": paired(mine, line([f"modelopt-s{s}" for s in range(5)])),
        }
    return result


def show(result: dict) -> None:
    for change, r in result.items():
        print(change)
        for name, run in r["runs"].items():
            depths = [round(a, 3) for a in run["accept_rate_per_depth"][:3]]
            print(" ", name, round(run["mean_accept_length"], 4), run["identical_to_baseline"], depths)
        print("  recipe, same seeds", {k: round(v, 4) for k, v in r["recipe_same_seeds"].items()})
        for key in ("over_recipe", "over_modelopt"):
            print(" ", key, {k: round(v, 4) if isinstance(v, float) else v for k, v in r[key].items()})


def main(variants: dict[str, dict[int, str]], argv: list[str]) -> None:
    """argv: [_, OUT.json, RUN_DIR]: assemble `variants`' runs in RUN_DIR, write them to OUT.json, show them."""
    out, run_dir = Path(argv[1]), Path(argv[2])
    result = assemble(variants, run_dir)
    out.write_text(json.dumps(result, indent=1) + "\n")
    show(result)


if __name__ == "__main__":
    main(VARIANTS, sys.argv)
