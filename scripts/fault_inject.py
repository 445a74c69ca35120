"""Fault injection: SIGKILL each long command at random points, run it again, and check that it ends with
what one uninterrupted run writes. JSON out.

    nice -n 10 python scripts/fault_inject.py --kills 3 --seed 0 --out runs/fault-inject.json
    python scripts/fault_inject.py --commands cache distill --kills 1 --target DIR   # CI-sized
    python scripts/fault_inject.py --kills 1 --small --rows 128 --target DIR          # the suite's

Commands, on tiny sizes (the tiny-target command's own output is the target of the others, unless
--target names one):

    tiny-target   --steps 300 on a small model; a kill loses the build, the same command starts over
    distill       the first 64 rows of a generated JSONL text file, chunks of 8 prompts; resumes by chunk
    cache         recipes/tiny/medusa.yaml on its 1024 rows (--rows), shards of 256 tokens; resumes by shard
    train         recipes/tiny/medusa.yaml on those rows, 800 steps, save_every=20, resume=auto throughout
    export        --format medusa of the reference train run's heads; a new folder written whole

For each command: one uninterrupted reference run, timed, its output folder watched (every 10 ms) for
its writes (into the folder or a temporary one beside it). Then kills: the command runs in a fresh folder
and is SIGKILLed (its whole process group) a uniform draw from [0, W) seconds after its first write,
where W is the time from the reference run's first write to its last: a kill before any write finds the
folder as it was, and one after the last finds it finished, so the kills land where the writes are. The
same command then runs again on the same folder and is killed again the same way, until --kills kills are
spent; the last run goes to the end. A run that exits before its kill closes its folder (a chain) and
the next kill starts a fresh one. Every closed chain is checked against the reference:

    identical   the files the design promises bit for bit: train (resume=auto) model.safetensors; cache
                every file; distill every file but _summary.json (its timings and skipped counts);
                export every file; tiny-target model.safetensors
    leftovers   nothing a killed writer left: no name holding ".tmp" (checkpoints/.tmp-step-N,
                .NAME.tmp-PID-*, .FILE.*.tmp) or ".specheads.lock" in the output folder, and nothing
                beside it

Report, per command: kills, resumes (runs started on a folder a kill left), chains, identical, and each
kill's point (seconds from the start and from the first write, files the folder held). Exit code 0 when
every command is identical and clean, 1 otherwise. Determinism needs one machine and one thread count
(OMP_NUM_THREADS=1 is set).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"
COMMANDS = ("tiny-target", "distill", "cache", "train", "export")
LOCK_FILE, PROBE_PREFIX = ".specheads.lock", ".specheads-probe-"  # core/run_folder.py
RUN_TIMEOUT_S = 900
POLL_S = 0.01  # how often a run's output folder is looked at

# tiny sizes: each run a few seconds of work after the interpreter's start-up
TINY_TARGET_ARGS = (
    "--steps 300 --max-files 24 --vocab-size 400 --hidden-size 64 --num-layers 2 --num-heads 2 "
    "--num-kv-heads 2 --intermediate-size 128 --seq-len 64 --batch-size 4 --eval-blocks 4 --warmup-steps 2 "
    "--no-sample"
).split()
DISTILL_ARGS = (
    "--max-rows 64 --prompt-tokens 16 --max-new-tokens 40 --chunk-rows 8 --batch-size 4 --no-progress"
).split()
RECIPE_ARGS = (
    "eval_data=[] eval_fraction=0.1 max_length=64 batch_size=4 medusa.num_heads=2 medusa.labels=data warmup_steps=2 "
    "report_to=none"
).split()
TRAIN_ARGS = "max_steps=800 save_every=20 eval_every=200 eval_batches=1 log_every=20 resume=auto".split()
# --small (the suite's): each command a second or two of work, the interpreter's start-up most of a run
SMALL = {
    "tiny-target": {"--steps": "20"},
    "distill": {"--max-rows": "16", "--chunk-rows": "4", "--max-new-tokens": "16"},
    "train": {"max_steps": "60", "save_every": "10", "eval_every": "60", "log_every": "10"},
}


def sized(name: str, args: list[str], small: bool) -> list[str]:
    """`args` of command `name`, with --small's values in place of the full-size ones."""
    if not small or name not in SMALL:
        return list(args)
    values, out = SMALL[name], []
    for i, a in enumerate(args):
        key = a.split("=", 1)[0]
        if "=" in a and key in values:
            out.append(f"{key}={values[key]}")
        elif i and args[i - 1] in values:
            out.append(values[args[i - 1]])
        else:
            out.append(a)
    return out


@dataclass
class Setup:
    """What the commands read: the work folder, the target, the data file, the reference heads."""

    work: Path
    python: str
    env: dict
    target: Path | None = None
    data: Path | None = None
    references: dict[str, Path] = field(default_factory=dict)
    small: bool = False  # --small: the suite's sizes (SMALL)


@dataclass
class Command:
    name: str
    argv: Callable[[Setup, Path], list[str]]  # (setup, output folder) -> arguments after `specheads`
    compared: Callable[[Path], list[str]]  # output folder -> the files that must be bit-identical
    # True if a folder a killed run left is already finished, so that running again would only be
    # refused (export writes a new folder whole: one that exists is the finished export)
    finished: Callable[[Path], bool] = lambda out: False


def all_files(out: Path, skip: tuple[str, ...] = ()) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name not in skip)


def recipe(s: Setup) -> list[str]:
    return [str(RECIPE), f"target={s.target}", f"data=[{s.data}]", *RECIPE_ARGS]


COMMAND_TABLE = {
    "tiny-target": Command(
        "tiny-target",
        lambda s, out: ["tiny-target", "--out", str(out), *sized("tiny-target", TINY_TARGET_ARGS, s.small)],
        lambda out: ["model.safetensors"],
    ),
    "distill": Command(
        "distill",
        lambda s, out: (
            ["distill", "--source", str(s.data), "--target", str(s.target), "--out", str(out)]
            + sized("distill", DISTILL_ARGS, s.small)
        ),
        lambda out: all_files(out, skip=("_summary.json",)),
    ),
    "cache": Command(
        "cache",
        lambda s, out: ["cache", *recipe(s), "--out", str(out), "--shard-tokens", "256", "--no-progress"],
        all_files,
    ),
    "train": Command(
        "train",
        lambda s, out: [
            "train",
            *recipe(s),
            f"output_dir={out}",
            *sized("train", TRAIN_ARGS, s.small),
            "--no-progress",
        ],
        lambda out: ["model.safetensors"],
    ),
    "export": Command(
        "export",
        lambda s, out: (
            ["export", "--heads", str(s.references["train"]), "--format", "medusa"]
            + ["--out", str(out), "--target", str(s.target)]
        ),
        all_files,
        finished=lambda out: out.is_dir(),
    ),
}


# -- running ----------------------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    returncode: int | None  # None: killed
    first_write_s: float | None  # when the output folder (or a temporary one beside it) first changed
    last_write_s: float | None  # when a poll last saw it change
    log: Path


def snapshot(folder: Path) -> set[tuple[str, int, int]]:
    """(path, size, mtime) of the files under `folder` and the paths of its folders, as a poll sees them.
    Not a folder's mtime, nor the probe file a command's writability check makes and removes at once:
    neither is the command's work."""
    found = set()
    for root, dirs, files in os.walk(folder):  # a folder renamed or removed mid-walk is skipped
        found.update((os.path.join(root, d), 0, 0) for d in dirs)
        for name in files:
            if name.startswith(PROBE_PREFIX):
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:  # renamed or removed between the listing and the stat
                continue
            found.add((os.path.join(root, name), st.st_size, st.st_mtime_ns))
    return found


def run(setup: Setup, argv: list[str], out: Path, log: Path, kill_delay: float | None = None) -> Run:
    """`specheads ARGV` in its own process group, watching `out`'s parent folder; with `kill_delay`, the
    whole group is SIGKILLed that many seconds after the run's first write there."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    before = snapshot(out.parent)
    started = time.perf_counter()
    first_write = last_write = killed = None
    with log.open("a") as f:
        f.write(f"$ specheads {' '.join(argv)}  (kill {kill_delay} s after its first write)\n")
        f.flush()
        proc = subprocess.Popen(
            [setup.python, "-m", "specheads", *argv],
            cwd=REPO,
            env=setup.env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while proc.poll() is None:
            now, seen = time.perf_counter() - started, snapshot(out.parent)
            if seen != before:
                first_write = now if first_write is None else first_write
                last_write, before = now, seen
            if kill_delay is not None and first_write is not None and now >= first_write + kill_delay:
                killed = now
            if killed is not None or now > RUN_TIMEOUT_S:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(POLL_S)
        rc = None if killed is not None else proc.returncode
        f.write(f"\n[exit {rc}]\n")
    return Run(time.perf_counter() - started, rc, first_write, last_write, log)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digests(cmd: Command, out: Path) -> dict[str, str | None]:
    return {name: sha256(out / name) if (out / name).is_file() else None for name in cmd.compared(out)}


def leftovers(out: Path) -> list[str]:
    """What a killed writer left: temporary or lock files inside `out`, anything beside it."""
    found = [str(p.relative_to(out.parent)) for p in out.parent.iterdir() if p.name != out.name]
    if out.is_dir():
        found += [
            str(p.relative_to(out.parent)) for p in out.rglob("*") if ".tmp" in p.name or p.name == LOCK_FILE
        ]
    return sorted(found)


def held(out: Path) -> int:
    """Files in the output folder (and temporary ones beside it): how far a killed run had come."""
    return sum(1 for p in out.parent.rglob("*") if p.is_file()) if out.parent.is_dir() else 0


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


# -- one command ------------------------------------------------------------------------------------


def reference(setup: Setup, cmd: Command) -> tuple[Path, Run]:
    """The uninterrupted run: its output folder, its timings."""
    out = setup.work / "reference" / cmd.name / "out"
    done = run(setup, cmd.argv(setup, out), out, setup.work / "logs" / f"{cmd.name}-reference.log")
    if done.returncode != 0 or done.first_write_s is None:
        raise RuntimeError(f"the reference {cmd.name} run failed:\n{tail(done.log)}")
    return out, done


def inject(setup: Setup, cmd: Command, kills: int, writing_s: float, rng: random.Random) -> dict:
    """Kill `cmd` `kills` times, each a uniform draw from [0, writing_s) seconds after the run's first
    write, finish it, compare with the reference (module doc)."""
    expected = digests(cmd, setup.references[cmd.name])
    report = {"kills": 0, "resumes": 0, "chains": 0, "identical": True, "kill_points": [], "problems": []}
    while report["kills"] < kills:
        chain = setup.work / cmd.name / f"chain-{report['chains']}"
        out, log = chain / "out", setup.work / "logs" / f"{cmd.name}-chain-{report['chains']}.log"
        report["chains"] += 1
        finished, after_kill = False, False
        while not finished:
            if after_kill and cmd.finished(out):
                break  # killed after its output was whole: nothing left to run
            delay = rng.uniform(0, writing_s) if report["kills"] < kills else None
            done = run(setup, cmd.argv(setup, out), out, log, delay)
            report["resumes"] += after_kill
            if done.returncode is None:
                report["kills"] += 1
                point = {"at_s": round(done.seconds, 2), "after_first_write_s": round(delay, 2)}
                report["kill_points"].append(point | {"files": held(out)})
                after_kill = True
            elif done.returncode == 0:
                finished = True
            else:
                report["problems"].append(f"{chain}: exit {done.returncode}:\n{tail(done.log)}")
                break
        got = digests(cmd, out)
        if got != expected:
            differ = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
            report["problems"].append(f"{chain}: differs from the reference in {differ}")
        left = leftovers(out)
        if left:
            report["problems"].append(f"{chain}: left behind {left}")
        if report["problems"]:
            break  # a failing command fails again: one report of it is enough
    report["identical"] = not report["problems"]
    report["compared"] = sorted(expected)
    return report


# -- the whole run ----------------------------------------------------------------------------------


def write_data(path: Path, rows: int = 1024) -> Path:
    """Cyclic text rows (tests/train/conftest.py's `text_data`): heads reading h_t can learn t+2+k."""
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": (words[i % 4] * 8)[i % 7 :]}) + "\n" for i in range(rows)))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=3, help="kills per command")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill points")
    p.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    p.add_argument("--rows", type=int, default=1024, help="rows of the generated data file")
    p.add_argument(
        "--target", type=Path, default=None, help="target of the other commands (default: tiny-target's)"
    )
    p.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--small", action="store_true", help="the suite's sizes: a few seconds a run")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error("--kills must be at least 1")

    started = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-inject-"))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "SPECHEADS_CACHE": str(work / "specheads-cache"),
        "HF_DATASETS_CACHE": str(work / "hf-datasets"),
    }
    setup = Setup(
        work,
        sys.executable,
        env,
        target=args.target,
        data=write_data(work / "data" / "rows.jsonl", args.rows),
        small=args.small,
    )
    # what each command needs first: the target (tiny-target's reference, without --target); export: heads
    needs = {c: ["train"] if c == "export" else [] for c in COMMANDS}
    if args.target is None:
        needs = {c: ["tiny-target", *n] if c != "tiny-target" else n for c, n in needs.items()}
    order = [c for c in COMMANDS if c in args.commands or any(c in needs[d] for d in args.commands)]
    references = {}
    try:
        for name in order:
            setup.references[name], references[name] = reference(setup, COMMAND_TABLE[name])
            if name == "tiny-target" and args.target is None:
                setup.target = setup.references[name]
        report = {}
        for name in args.commands:
            ref = references[name]
            writing_s = max(ref.last_write_s - ref.first_write_s, POLL_S)
            rng = random.Random(f"{args.seed}:{name}")
            report[name] = {
                "reference_s": round(ref.seconds, 1),
                "writes_s": [round(ref.first_write_s, 2), round(ref.last_write_s, 2)],
                **inject(setup, COMMAND_TABLE[name], args.kills, writing_s, rng),
            }
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "kills_per_command": args.kills,
        "seed": args.seed,
        "commands": report,
        "all_identical": all(r["identical"] for r in report.values()),
        "seconds": round(time.perf_counter() - started, 1),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if result["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
