"""What `keep_host_memory` (train/host_memory.py) does to a CPU training run, JSON out.

    python benchmarks/bench_host_memory.py recipes/smollm2-135m/eagle3.yaml --steps 8 \
        --out runs/host-memory.json -- "data=[DIR]"

Trains the recipe twice at once, side by side on one thread each, with `keep_host_memory=false` and `=true`
(the same seed and data, so the same losses), so that both share the machine's load. For each run: its
process's minor page faults, user and system CPU seconds and peak RSS (from wait4, start-up included), the
loop's own seconds a step (train_summary.json) and its held-out metrics; and the ratios between the two. Any
further arguments after `--` go to both `specheads train` commands as overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run by path (python benchmarks/X.py) as well as with -m: the repository root, for `benchmarks`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_trainers_jobs import load_average, specheads_cmd


def start(recipe: str, steps: int, keep: bool, out: Path, overrides: list[str], threads: int):
    command = specheads_cmd(
        "train", recipe, *overrides,
        f"max_steps={steps}", f"eval_every={steps}", f"save_every={steps}",
        f"keep_host_memory={str(keep).lower()}", "report_to=none", f"output_dir={out}",
        "--threads", str(threads), "--no-progress", "--overwrite",
    )  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), command, log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="threads each run")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("overrides", nargs="*", help="after --: overrides for both runs")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-host-memory-"))
    started, runs = time.time(), {}
    load_before = load_average()
    for keep in (False, True):
        out = work / f"keep-{str(keep).lower()}"
        runs[keep] = start(args.recipe, args.steps, keep, out, args.overrides, args.threads) + (out,)
    usage = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        while len(usage) < len(runs):
            pid, status, rusage = os.wait4(-1, 0)
            for keep, (process, *_rest) in runs.items():
                if process.pid == pid:
                    usage[keep] = (os.waitstatus_to_exitcode(status), rusage, time.time() - started)
    finally:  # stopped (Ctrl-C, SIGTERM): no run left behind
        for keep, (process, *_rest) in runs.items():
            if keep not in usage:
                process.kill()
    load_after = load_average()

    results = {}
    for keep, (_process, command, log, out) in runs.items():
        log.close()
        code, rusage, wall = usage[keep]
        if code != 0:
            print(out.with_suffix(".log").read_text()[-4000:], file=sys.stderr)
            raise SystemExit(f"the run with keep_host_memory={keep} exited {code}; its log is above ({work})")
        summary = json.loads((out / "train_summary.json").read_text())
        results[f"keep_host_memory={str(keep).lower()}"] = {
            "command": " ".join(command),
            "wall_seconds": round(wall, 1),
            "minor_page_faults": rusage.ru_minflt,
            "major_page_faults": rusage.ru_majflt,
            "user_seconds": round(rusage.ru_utime, 1),
            "system_seconds": round(rusage.ru_stime, 1),
            "peak_rss_gib": round(rusage.ru_maxrss / 2**20, 3),  # Linux: KiB
            "step_seconds": round(summary["step_seconds"], 3),
            "eval": summary["eval"],
        }
    off, on = results["keep_host_memory=false"], results["keep_host_memory=true"]
    report = {
        "recipe": args.recipe,
        "steps": args.steps,
        "threads_each": args.threads,
        "side_by_side": True,
        "overrides": args.overrides,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": {
            "before": load_before, "after": load_after}},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "runs": results,
        "ratios_off_over_on": {
            key: round(off[key] / on[key], 3) if on[key] else None
            for key in ("step_seconds", "wall_seconds", "minor_page_faults", "system_seconds", "peak_rss_gib")
        },
        "same_eval": off["eval"] == on["eval"],
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios_off_over_on"]), "same eval:", report["same_eval"])
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
