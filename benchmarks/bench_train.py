"""Training cost on the embedded tiny target, JSON out.

    python benchmarks/bench_train.py --out runs/bench-train.json

1. Online step time against the target's forward-only time, per method (medusa, medusa2, eagle,
   eagle3): a short `specheads train` run of each tiny recipe; the loop times every target forward
   (`target_forward_seconds`) and every optimizer step (`step_seconds`) into train_summary.json.
   Medusa-2 runs its (adapted) target inside the objective's forward, so it has a step time only.
2. The same runs offline: `specheads cache` (bf16), then `specheads train ... mode=offline`: the step
   without the target's decoder layers.
3. Memory per process with the frozen target replicated (DDP) against sharded (DeepSpeed ZeRO-3):
   2 CPU processes of the EAGLE recipe; target parameter bytes resident on each process, and each
   process's RSS (its peak, which includes loading the checkpoint, and at the end of the run). The tiny target is a few MB, far below the Python + torch footprint, so
   `--memory-hidden H` also runs it on a random Llama of width H (8 layers, the tiny tokenizer), whose
   weights are not lost in that footprint.

Bytes per token of the offline cache and its read throughput: benchmarks/bench_offline.py. Every run is a
subprocess (its own RSS, no state shared); the machine is shared, so the times are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specheads.builders.tiny_target import ensure_tiny_target
from specheads.methods import method_named, methods
from specheads.train.sources import stdlib_rows

REPO = Path(__file__).resolve().parents[1]
METHODS = tuple(methods())  # the method table: one recipe each in recipes/tiny/
FP32_BYTES = 4


def write_data(path: Path, files: int) -> Path:
    """The first `files` stdlib training files as text rows (the loop cuts them into max_length windows)."""
    rows = stdlib_rows(heldout=False).select(range(files))
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows["text"]))
    return path


def run(cmd: list[str], threads: int) -> float:
    """Run a command from the repository root; returns its wall seconds (raises with its output on failure)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    started = time.perf_counter()
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return time.perf_counter() - started


def overrides(args, target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"target={target}",
        f"data={data}",
        f"max_length={args.max_length}",
        f"batch_size={args.batch_size}",
        f"max_steps={args.steps}",
        "warmup_steps=2",
        "eval_fraction=0.1",
        f"eval_every={args.steps}",
        "eval_batches=1",
        f"log_every={args.steps}",
        "report_to=none",
        f"output_dir={out}",
        *extra,
    ]


def summary_of(out: Path) -> dict:
    return json.loads((out / "train_summary.json").read_text())


def step_figures(summary: dict) -> dict:
    keys = ("step_seconds", "target_forward_seconds", "step_to_target_forward_ratio", "labels_per_second")
    return {k: summary[k] for k in keys}


def bench_method(args, method: str, target: Path, data: Path, work: Path) -> dict:
    """One method online, and (but Medusa-2) offline from a bf16 cache of the same rows."""
    recipe = str(REPO / "recipes" / "tiny" / f"{method}.yaml")
    train = [sys.executable, "-m", "specheads.train", recipe]
    online = work / f"{method}-online"
    run([*train, *overrides(args, target, data, online), "--no-progress"], args.threads)
    result = {"online": step_figures(summary_of(online))}
    if method_named(method).online_only:  # Medusa-2's adapters change the hidden states: no offline mode
        return result
    cache = work / f"{method}-cache"
    cache_cmd = [
        sys.executable,
        "-m",
        "specheads.cli",
        "cache",
        recipe,
        *overrides(args, target, data, online),
    ]
    cache_seconds = run(
        [*cache_cmd, "--out", str(cache), "--dtype", "bfloat16", "--no-progress"], args.threads
    )
    index = json.loads((cache / "train" / "index.json").read_text())
    size = sum((cache / "train" / s["file"]).stat().st_size for s in index["shards"])
    offline = work / f"{method}-offline"
    extra = ("mode=offline", f"cache_dir={cache}")
    run([*train, *overrides(args, target, data, offline, *extra), "--no-progress"], args.threads)
    off = summary_of(offline)
    result["offline"] = {
        **step_figures(off),
        "step_speedup_over_online": result["online"]["step_seconds"] / off["step_seconds"],
        "cache_build_seconds": cache_seconds,  # process start, tokenising and the target's forwards
        "cache_bytes_per_token": size / index["num_tokens"],
        "target_parameters_loaded": off["target_parameters"],
    }
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_memory(args, target: Path, data: Path, work: Path, name: str) -> dict:
    """Per-process memory with the target replicated (DDP) and sharded (ZeRO-3), 2 CPU processes."""
    figures = {}
    for layout, config in (("ddp", "ddp.yaml"), ("zero3", "zero3-sharded-target.yaml")):
        out = work / f"memory-{name}-{layout}"
        steps = (
            f"max_steps={args.memory_steps}",
            f"eval_every={args.memory_steps}",
            f"log_every={args.memory_steps}",
        )
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(REPO / "recipes" / "accelerate" / config),
            "--num_processes", "2", "--main_process_port", str(free_port()),
            "-m", "specheads.train", str(REPO / "recipes" / "tiny" / "eagle.yaml"),
            *overrides(args, target, data, out, "noise=0", *steps), "--no-progress",
        ]  # fmt: skip
        run(cmd, threads=1)
        s = summary_of(out)
        figures[layout] = {
            "processes": s["processes"],
            "target_parameters": s["target_parameters"],
            "target_parameter_bytes_per_process": [n * FP32_BYTES for n in s["target_resident_parameters"]],
            "peak_rss_bytes_per_process": s["peak_rss_bytes"],  # loading included
            "rss_bytes_at_end_per_process": s["rss_bytes_at_end"],
            "step_seconds": s["step_seconds"],
        }
    ddp, zero3 = figures["ddp"], figures["zero3"]
    figures["zero3_over_ddp"] = {
        "target_parameter_bytes": max(zero3["target_parameter_bytes_per_process"])
        / max(ddp["target_parameter_bytes_per_process"]),
        "peak_rss": max(zero3["peak_rss_bytes_per_process"]) / max(ddp["peak_rss_bytes_per_process"]),
        "rss_at_end": max(zero3["rss_bytes_at_end_per_process"]) / max(ddp["rss_bytes_at_end_per_process"]),
    }
    return figures


def random_llama(tiny: Path, hidden: int, out: Path) -> Path:
    """A random Llama of width `hidden` (8 layers) with the tiny target's tokenizer, fp32, saved at `out`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny)
    config.update(
        dict(
            hidden_size=hidden,
            intermediate_size=hidden * 11 // 4,
            num_hidden_layers=8,
            num_attention_heads=hidden // 64,
            num_key_value_heads=hidden // 64,
        )
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--files", type=int, default=30, help="stdlib training files in the data")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the one-process runs")
    p.add_argument(
        "--memory-hidden", type=int, default=0, help="also measure memory on a random Llama this wide"
    )
    p.add_argument("--memory-steps", type=int, default=5, help="optimizer steps of the memory runs")
    p.add_argument("--no-memory", action="store_true", help="skip the 2-process memory runs")
    p.add_argument("--work", type=Path, default=None, help="run folders (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: print)")
    args = p.parse_args()

    tiny, meta, _ = ensure_tiny_target()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = write_data(work / "stdlib.jsonl", args.files)
        methods = {m: bench_method(args, m, tiny, data, work) for m in args.methods.split(",") if m}
        memory = {} if args.no_memory else {"tiny": bench_memory(args, tiny, data, work, "tiny")}
        if args.memory_hidden and not args.no_memory:
            wide = random_llama(tiny, args.memory_hidden, work / f"llama-h{args.memory_hidden}")
            memory[f"random-llama-h{args.memory_hidden}"] = bench_memory(args, wide, data, work, "wide")
    report = {
        "target": {"path": str(tiny), "parameters": meta["parameters"]},
        "settings": {k: getattr(args, k) for k in ("steps", "batch_size", "max_length", "files", "threads")},
        "methods": methods,
        "memory_2_processes": memory,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
