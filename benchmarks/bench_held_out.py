"""What keeping the target's held-out states saves (train/held_out.py, `eval_cache_mib`), JSON out.

    python benchmarks/bench_held_out.py recipes/smollm2-135m/eagle3.yaml "data=[data/smollm2-seed-sd-all]" \
        max_steps=10 eval_every=2 --threads 1 --out runs/bench-held-out.json

Runs `specheads train RECIPE OVERRIDES` twice, one after the other, each in its own process: with
`eval_cache_mib=0` (the target runs at every evaluation) and as the recipe says (1024 MiB by default).
Reports each run's time in evaluations (`eval_seconds` of train_summary.json), its wall time and peak RSS,
and whether the two logged the same held-out metrics at every evaluation (to the last bit, and to float
rounding: an EAGLE-3 loss reads the draft vocabulary's columns of a kept batch from a product over those
rows of the lm_head alone) and saved the same heads, as they should. The machine is shared, so the times
are noisy: run it on a quiet one, and read the load average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from safetensors.torch import load_file

RUNS = {"forward_each_time": ["eval_cache_mib=0"], "kept": []}


def train(recipe: str, overrides: list[str], out: Path, threads: int) -> dict:
    """One `specheads train` run into `out`: its summary, its eval records and its heads."""
    command = [sys.executable, "-m", "specheads", "train", recipe, *overrides, f"output_dir={out}"]
    command += ["report_to=none", "--threads", str(threads), "--overwrite"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "train_summary.json").read_text())
    lines = (out / "metrics.jsonl").read_text().splitlines()
    evals = [record for record in map(json.loads, lines) if record.get("split") == "eval"]
    return {"summary": summary, "evals": evals, "heads": load_file(out / "model.safetensors")}


def close_records(a: dict, b: dict) -> bool:
    """The same keys and values, floats to a relative 1e-6."""

    def close(x, y) -> bool:
        floats = isinstance(x, float) and isinstance(y, float)
        return x == y or (floats and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9))

    return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="key=value recipe overrides for both runs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=Path, default=None, help="run folders (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: print)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        done = {
            name: train(args.recipe, [*args.overrides, *extra], work / name, args.threads)
            for name, extra in RUNS.items()
        }
    base, kept = done["forward_each_time"], done["kept"]
    result = {
        "recipe": args.recipe,
        "overrides": args.overrides,
        "threads": args.threads,
        "load_average_at_end": os.getloadavg(),
        "evaluations": len(kept["evals"]),
        "same_eval_metrics": base["evals"] == kept["evals"],  # to the last bit
        # to float rounding: EAGLE-3's kept batches give the teacher from a product over fewer rows
        "close_eval_metrics": len(base["evals"]) == len(kept["evals"])
        and all(close_records(a, b) for a, b in zip(base["evals"], kept["evals"])),
        "same_heads": base["heads"].keys() == kept["heads"].keys()
        and all(base["heads"][k].equal(kept["heads"][k]) for k in base["heads"]),
        "runs": {
            name: {
                key: run["summary"][key]
                for key in ("wall_seconds", "eval_seconds", "step_seconds", "peak_rss_bytes")
            }
            for name, run in done.items()
        },
    }
    result["eval_seconds_ratio"] = base["summary"]["eval_seconds"] / max(
        kept["summary"]["eval_seconds"], 1e-9
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
