"""Gather the 2026-12-05 recipe-budget runs into runs.json.gz: each process's `/usr/bin/time -v`, our
train summaries, Model Optimizer's out.json, each eval (with its per-prompt records) and the prompt-by-prompt
comparisons (benchmarks/bench_trainers_paired.py).

    python benchmarks/records/eagle3-smollm2/2026-12-05-recipe-budget-xeon/assemble.py RUN_DIR OUT.json

Run from the repository root. RUN_DIR holds what pair.sh (and the two runs of ours beside it) wrote:
prep-s0.log, modelopt-s0/, ours-s0/, ours-s0-fp32/, ours-s1/, each NAME with NAME.log (time -v) and eval-NAME/.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import eval_record as evaluation
from benchmarks.records import paired, time_v, write_json

run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])

prep = json.loads((run_dir / "prep-s0.log").read_text().strip().splitlines()[-1])
runs = {}
mo = json.loads((run_dir / "modelopt-s0" / "out.json").read_text())
losses = [h["loss"] for h in mo["log_history"] if "loss" in h]
runs["modelopt-s0"] = {
    "trainer": "Model Optimizer 0.47.0, lr 2e-3 and a 10% warm-up (2026-12-02-recipe-budget/modelopt_job.py)",
    "seed": 0,
    **time_v(run_dir / "modelopt-s0.log"),
    "loop_s": mo["seconds"]["train"],
    "global_step": mo["global_step"],
    "loss_first_last": [losses[0], losses[-1]],
    "overrides": json.loads((run_dir / "modelopt-s0" / "job.json").read_text())["overrides"],
}
for name, seed, extra in (
    ("ours-s0", 0, []),
    ("ours-s0-fp32", 0, ["muon_dtype=float32"]),
    ("ours-s1", 1, []),
):
    summary = json.loads((run_dir / name / "train_summary.json").read_text())
    runs[name] = {
        "trainer": "specheads, recipes/smollm2-135m/eagle3.yaml",
        "seed": seed,
        "overrides": [f"seed={seed}", *extra],
        **time_v(run_dir / f"{name}.log"),
        "loop_s": summary["wall_seconds"],
        "train_summary": summary,
    }
for name, r in runs.items():
    r["tokens_seen"] = (
        prep["tokens"] if r["seed"] == 0 else None
    )  # seed 1 sees other rows (411,729 in ../2026-12-02-recipe-budget)
    r["eval"] = evaluation(run_dir / f"eval-{name}")
    if r["tokens_seen"]:
        r["tokens_per_s"] = round(r["tokens_seen"] / r["wall_s"], 1)


def pair(a: str, b: str) -> dict:
    return paired(
        [{"per_prompt": runs[a]["eval"]["per_prompt"]}], [{"per_prompt": runs[b]["eval"]["per_prompt"]}]
    )


comparisons = {f"{a} vs {b}": pair(a, b) for a, b in (("ours-s0", "modelopt-s0"), ("ours-s0-fp32", "modelopt-s0"),
                                                       ("ours-s0-fp32", "ours-s0"))}  # fmt: skip
result = {"machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process", "date": "2026-12-05",
          "budget": {"steps": 200, "batch": 8, "seed 0 rows": prep}, "runs": runs, "paired": comparisons}  # fmt: skip
write_json(out, result)
for name, r in runs.items():
    print(name, round(r["eval"]["mean_accept_length"], 3), r["eval"]["identical_to_baseline"], r["wall_s"],
          r.get("tokens_per_s"), r["peak_rss_mib"])  # fmt: skip
for k, v in comparisons.items():
    print(k, {x: round(y, 4) if isinstance(y, float) else y for x, y in v.items()})
