"""Gather the 2026-12-06 runs into runs.json.gz: Model Optimizer seed 4 beside ours seed 4 (a fifth pair
since the held-out evaluations read only the teacher's columns), and every head of seeds 0-4 a side decoded on all
80 MT-Bench first turns: the bench's 32 (each pair's `eval-NAME/`) and the 48 it leaves out (`eval48-NAME/`).

    python benchmarks/records/eagle3-smollm2/2026-12-06-mt80/assemble.py OUT.json SEED=RUN_DIR [SEED=RUN_DIR ...]

Run from the repository root, with RUN_DIR the folder of seed SEED's pair (`pair.sh RUN_DIR DATA SEED SEED
ours-t15`: modelopt-sS/, ours-t15-sS/, their logs, eval-*/, eval48-*/, prep-sS.log). A seed whose pair an
earlier run's runs.json.gz reports (`EARLIER`) is checked against it: its 32 prompts must decode in the same
steps as that report says. A seed that none reports is the new pair, recorded with its speeds side by side.
"""

import json
import statistics
import sys
from pathlib import Path

from specheads.evaluate.report import per_category, summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for `benchmarks`
from benchmarks.records import (
    modelopt_record,
    ours_record,
    paired,
    prompt_steps,
    read_json,
    side_by_side,
    with_speeds,
    write_json,
)

HERE = Path(__file__).parent
STEPS = 200
KINDS = ("modelopt", "ours-t15")
# the run whose runs.json.gz reports each earlier pair, as made on this machine
EARLIER = {
    0: "2026-12-06-teacher-columns",
    1: "2026-12-06-pairs",
    2: "2026-12-06-pairs",
    3: "2026-12-06-pairs",
}
# where seed 4 was made before (../2026-12-05-side-by-side, on this Xeon type)
BEFORE_S4 = "2026-12-05-side-by-side"

DEPTH = 5  # dynamic-16's depth: results.json's accept_rate_per_depth has one entry a depth


def results(folder: Path) -> dict:
    ev = json.loads((folder / "results.json").read_text())
    assert len(ev["accept_rate_per_depth"]) == DEPTH and ev["tree"]["name"] == "dynamic-16", folder
    return ev


def measure(per_prompt: list[dict]) -> dict:
    """tau, acceptance per depth, identity and tau per category over per-prompt records, as `specheads eval`
    figures them (evaluate.report's summarize and per_category)."""
    figures = summarize(per_prompt, DEPTH)
    return {
        "n_prompts": figures["num_prompts"],
        "tau": figures["mean_accept_length"],
        "accept_rate_per_depth": figures["accept_rate_per_depth"],
        "identical_to_baseline": figures["identical_to_baseline"],
        "per_category": {
            c: f["mean_accept_length"] for c, f in sorted(per_category(per_prompt, DEPTH).items())
        },
    }


out = Path(sys.argv[1])
runs, pair_speeds, same_32 = {}, {}, {}
for arg in sys.argv[2:]:
    seed, run_dir = arg.split("=", 1)
    seed, run_dir = int(seed), Path(run_dir)
    report = read_json(HERE.parent / EARLIER[seed] / "runs.json") if seed in EARLIER else None
    for kind in KINDS:
        name = f"{kind}-s{seed}"
        ev32, ev48 = results(run_dir / f"eval-{name}"), results(run_dir / f"eval48-{name}")
        p32, p48 = ev32["per_prompt"], ev48["per_prompt"]
        assert not {p["id"] for p in p32} & {p["id"] for p in p48}, f"{name}: the 48 repeat one of the 32"
        runs[name] = {
            "seed": seed,
            "run_dir": str(run_dir),
            "mt32": measure(p32),
            "mt48": measure(p48),
            "mt80": measure(p32 + p48),
            "per_prompt_32": prompt_steps(ev32),
            "per_prompt_48": prompt_steps(ev48),
            "eval48_command": ev48["command"],
        }
        if report:
            same_32[name] = report["runs"][name]["eval"]["per_prompt"] == runs[name]["per_prompt_32"]
    # the new pair: its speeds side by side, and its identity with ../2026-12-05-side-by-side's runs of the seed
    if seed not in EARLIER:
        tokens = json.loads((run_dir / f"prep-s{seed}.log").read_text().strip().splitlines()[-1])["tokens"]
        about = {"record": "2026-12-06-mt80", "seed": seed}
        mo, us = (f"{k}-s{seed}" for k in KINDS)
        theirs = with_speeds(modelopt_record(run_dir, mo, tokens, **about, beside=us), STEPS)
        ours = with_speeds(
            ours_record(run_dir, us, tokens, **about, beside=mo, overrides=[f"seed={seed}"]), STEPS
        )
        before = read_json(HERE.parent / BEFORE_S4 / "runs.json")["runs"]
        pair_speeds[f"{us} / {mo}"] = {
            "runs": {mo: theirs, us: ours},
            "side_by_side": side_by_side(ours, theirs),
            "same_steps_as_before": {
                n: r["eval"]["per_prompt"] == before[n]["eval"]["per_prompt"]
                for n, r in ((mo, theirs), (us, ours))
            },
        }
        for name in (mo, us):
            same_32[name] = pair_speeds[f"{us} / {mo}"]["same_steps_as_before"][name]

pairs_before = read_json(HERE.parent / "2026-12-06-pairs" / "runs.json")["since_teacher_columns"]["pairs"]
since = pairs_before | {k: v["side_by_side"] for k, v in pair_speeds.items()}


def span(key: str) -> list[float]:
    """[lowest, highest] of one ratio over the pairs since the teacher's columns."""
    return [min(p[key] for p in since.values()), max(p[key] for p in since.values())]


def line(kind: str, part: str) -> list[dict]:
    key = {"mt32": "per_prompt_32", "mt48": "per_prompt_48"}
    return [
        {"per_prompt": r[key[part]] if part in key else r["per_prompt_32"] | r["per_prompt_48"]}
        for n, r in runs.items()
        if n.startswith(kind)
    ]


def taus(kind: str, part: str) -> dict:
    values = [r[part]["tau"] for n, r in runs.items() if n.startswith(kind)]
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "runs": len(values)}


result = {
    "machine": "2-core Intel Xeon (AVX512-BF16, AMX-BF16), fp32, one thread a process",
    "date": "2026-12-06",
    "budget": {"steps": STEPS, "batch": 8},
    "prompts": "MT-Bench first turns: mt32 the bench's 32 (four a category), mt48 the other 48, mt80 all",
    "runs": runs,
    "same_32_steps_as_reported": same_32,
    "pair": pair_speeds,
    "since_teacher_columns": {
        "pairs": since,
        "tokens_per_s": span("tokens_per_s"),
        "tokens_per_s_mean": round(statistics.fmean(p["tokens_per_s"] for p in since.values()), 3),
        "steps_tokens_per_s": span("steps_tokens_per_s"),
        "peak_rss": span("peak_rss"),
    },
    "tau": {part: {kind: taus(kind, part) for kind in KINDS} for part in ("mt32", "mt48", "mt80")},
    "paired": {part: paired(line("ours", part), line("modelopt", part)) for part in ("mt32", "mt48", "mt80")},
}
write_json(out, result)
for name, r in runs.items():
    print(name, *(f"{part} {r[part]['tau']:.4f} {r[part]['identical_to_baseline']}" for part in ("mt32", "mt48", "mt80")))  # fmt: skip
for key in ("same_32_steps_as_reported", "tau", "paired", "since_teacher_columns"):
    print(key, json.dumps(result[key]))
for k, v in pair_speeds.items():
    print(k, json.dumps(v["side_by_side"]), json.dumps(v["same_steps_as_before"]),
          {n: (r["wall_s"], r["tokens_per_s"], r["tokens_per_step_s"], r["peak_rss_mib"]) for n, r in v["runs"].items()})  # fmt: skip
