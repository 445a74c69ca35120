"""Gather the 2026-12-05 recipe-budget pairs into runs.json.gz, with the earlier runs they are compared
with taken from ../2026-12-05-teacher-recipe-budget/runs.json.gz: each process's `/usr/bin/time -v`, our train summaries,
Model Optimizer's out.json, each eval (with its per-prompt records), target tokens seen and tokens/s side by
side, and the prompt-by-prompt comparisons (benchmarks/bench_trainers_paired.py).

    python benchmarks/records/eagle3-smollm2/2026-12-05-side-by-side/assemble.py RUN_DIR OUT.json

Run from the repository root. RUN_DIR holds pair.sh's runs: modelopt-sM/, ours-t15-sO/, each NAME with NAME.log
(time -v), eval-NAME/, prep-sM.log, and count-sO.log (prep_rows.py's line for ours' seed: its tokens seen).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import eval_record as evaluation
from benchmarks.records import paired, read_json, time_v, write_json

HERE = Path(__file__).parent
run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
# (Model Optimizer's seed, ours' seed, ours' name, its overrides beyond the seed), each pair side by side
PAIRS = (
    (2, 3, "ours-t15", []),
    (3, 4, "ours-t15", []),
    (4, 2, "ours-t1", ["eagle3_teacher_temperature=1.0"]),
)


def tokens(log: Path) -> int:
    return json.loads(log.read_text().strip().splitlines()[-1])["tokens"]


earlier = read_json(HERE.parent / "2026-12-05-teacher-recipe-budget" / "runs.json")["runs"]
runs = {}
for mo_seed, ours_seed, ours, extra in PAIRS:
    mo_name, ours_name = f"modelopt-s{mo_seed}", f"{ours}-s{ours_seed}"
    if not (run_dir / f"eval-{ours_name}" / "results.json").exists():
        continue
    mo = json.loads((run_dir / mo_name / "out.json").read_text())
    losses = [h["loss"] for h in mo["log_history"] if "loss" in h]
    runs[mo_name] = {
        "record": "2026-12-05-side-by-side",
        "trainer": "Model Optimizer 0.47.0, lr 2e-3 and a 10% warm-up (2026-12-02-recipe-budget/modelopt_job.py)",
        "seed": mo_seed,
        "beside": ours_name,
        **time_v(run_dir / f"{mo_name}.log"),
        "loop_s": mo["seconds"]["train"],
        "global_step": mo["global_step"],
        "loss_first_last": [losses[0], losses[-1]],
        "overrides": json.loads((run_dir / mo_name / "job.json").read_text())["overrides"],
        "tokens_seen": tokens(run_dir / f"prep-s{mo_seed}.log"),
        "eval": evaluation(run_dir / f"eval-{mo_name}"),
    }
    summary = json.loads((run_dir / ours_name / "train_summary.json").read_text())
    runs[ours_name] = {
        "record": "2026-12-05-side-by-side",
        "trainer": "specheads, recipes/smollm2-135m/eagle3.yaml as it ships (T 1.5, eval_cache_mib 1024)"
        + (f", with {' '.join(extra)}" if extra else ""),
        "seed": ours_seed,
        "beside": mo_name,
        "overrides": [f"seed={ours_seed}", *extra],
        **time_v(run_dir / f"{ours_name}.log"),
        "loop_s": summary["wall_seconds"],
        "train_summary": summary,
        "tokens_seen": tokens(run_dir / f"count-s{ours_seed}.log"),
        "eval": evaluation(run_dir / f"eval-{ours_name}"),
    }
for r in runs.values():
    r["tokens_per_s"] = round(r["tokens_seen"] / r["wall_s"], 1)  # the whole process, as time -v saw it
    steps = r["train_summary"]["step_seconds"] * 200 if "train_summary" in r else r["loop_s"]
    r["tokens_per_step_s"] = round(r["tokens_seen"] / steps, 1)  # its 200 steps alone
beside = [(f"modelopt-s{a}", f"{name}-s{b}") for a, b, name, _ in PAIRS if f"{name}-s{b}" in runs]
side_by_side = {
    f"{o} / {m}": {
        "tokens_per_s": round(runs[o]["tokens_per_s"] / runs[m]["tokens_per_s"], 3),
        "steps_tokens_per_s": round(runs[o]["tokens_per_step_s"] / runs[m]["tokens_per_step_s"], 3),
        "peak_rss": round(runs[o]["peak_rss_mib"] / runs[m]["peak_rss_mib"], 3),
    }
    for m, o in beside
}


def per_prompt(name: str) -> dict:
    return {"per_prompt": (runs.get(name) or earlier[name])["eval"]["per_prompt"]}


def pair(a: list[str], b: list[str]) -> dict:
    return paired([per_prompt(n) for n in a], [per_prompt(n) for n in b])


ours = ["ours-t15-s0", "ours-t15-s1", "ours-t15-s2", *(n for n in runs if n.startswith("ours-t15-"))]
t1 = [
    "ours-s0",
    "ours-s1",
    *(n for n in runs if n.startswith("ours-t1-")),
]  # ../2026-12-05-recipe-budget-xeon's T 1 runs are "ours-sN"
theirs = ["modelopt-s0", "modelopt-s1", *(n for n in runs if n.startswith("modelopt-"))]
comparisons = {
    f"ours-t15 {len(ours)} seeds vs modelopt {len(theirs)} seeds": pair(ours, theirs),
    f"ours-t15 {len(ours)} seeds vs ours T 1 {len(t1)} seeds": pair(ours, t1),
    f"ours T 1 {len(t1)} seeds vs modelopt {len(theirs)} seeds": pair(t1, theirs),
    **{f"{o} vs {m}": pair([o], [m]) for m, o in beside},
}


def tau(name: str) -> float:
    return round((runs.get(name) or earlier[name])["eval"]["mean_accept_length"], 4)


means = {
    "ours-t15": [tau(n) for n in ours],
    "ours-t1": [tau(n) for n in t1],
    "modelopt": [tau(n) for n in theirs],
}
result = {
    "machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process, each pair side by side",
    "date": "2026-12-05",
    "budget": {"steps": 200, "batch": 8},
    "runs": runs,
    "side_by_side": side_by_side,
    "tau": means,
    "paired": comparisons,
}
write_json(out, result)
for name, r in runs.items():
    print(name, round(r["eval"]["mean_accept_length"], 3), r["eval"]["identical_to_baseline"], r["wall_s"],
          r["tokens_per_s"], r["tokens_per_step_s"], r["peak_rss_mib"], r.get("train_summary", {}).get("eval_seconds"))  # fmt: skip
print(json.dumps(side_by_side), json.dumps(means))
for k, v in comparisons.items():
    print(k, {x: round(y, 4) if isinstance(y, float) else y for x, y in v.items()})
