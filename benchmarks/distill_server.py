"""In-process distillation against distillation through a server, side by side: the same prompts, the same
max new tokens, greedy; answer tokens per second of each, as JSON.

    python benchmarks/distill_server.py --target tiny --prompts 16 --max-new-tokens 64
    python benchmarks/distill_server.py --target smollm2 --server http://127.0.0.1:8000   # a server you run

Without --server, `transformers serve` (PyPI transformers[serving]) is started on a free loopback port
with continuous batching and stopped at the end; its torch threads are --threads, as in-process.
The in-process run generates in batches of --batch-size; the server gets --concurrency requests at once.
Both write a distillation folder under a temporary directory (removed), and their rows are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import datasets
import torch

from specheads.builders.named_targets import resolve_target
from specheads.core.target import FrozenTarget
from specheads.data.distillation import DistillConfig, distill
from specheads.data.server_distill import ServerTarget

TOPICS = ["sorts a list", "parses a date", "reverses a string", "counts words", "merges two dicts"]
TOPICS += ["reads a CSV file", "checks a prime", "flattens a list", "computes a mean", "finds a maximum"]


def prompts(n: int) -> datasets.Dataset:
    chats = [
        [{"role": "user", "content": f"Write a Python function that {TOPICS[i % len(TOPICS)]} ({i})."}]
        for i in range(n)
    ]
    return datasets.Dataset.from_dict({"messages": chats})


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def start_server(model_dir: str, threads: int, log: Path, timeout: float = 900.0):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", model_dir, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--device", "cpu", "--dtype", "float32", "--continuous-batching"]
    argv += ["--cb-block-size", "16", "--cb-num-blocks", "1024", "--log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return process, url
        except OSError:
            time.sleep(1)
    os.killpg(process.pid, signal.SIGKILL)
    raise TimeoutError(f"the server did not start in {timeout} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="tiny")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16, help="in-process generate() batch")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight on the server")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads, in-process and the started server's"
    )
    p.add_argument("--server", default=None, help="a running server serving the target (default: start one)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    target_dir = str(resolve_target(args.target))
    rows = prompts(args.prompts)
    cfg = DistillConfig(
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, chunk_rows=args.prompts
    )
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        target = FrozenTarget.from_pretrained(target_dir)
        local = distill(rows, target, tmp / "in-process", cfg, progress=False)
        del target
        process = None
        if args.server is None:
            process, url = start_server(target_dir, args.threads, tmp / "serve.log")
        else:
            url = args.server
        try:
            served = ServerTarget.connect(target_dir, [url], concurrency=args.concurrency)
            try:
                remote = distill(rows, served, tmp / "server", cfg, progress=False)
            finally:
                served.close()
        finally:
            if process is not None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        same_rows = [p.read_bytes() for p in sorted((tmp / "in-process").glob("part-*"))] == [
            p.read_bytes() for p in sorted((tmp / "server").glob("part-*"))
        ]
    result = {
        "target": args.target,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "in_process": {
            "batch_size": args.batch_size,
            "new_tokens": local["new_tokens"],
            "seconds": local["seconds"],
            "tokens_per_second": local["new_tokens_per_second"],
        },
        "server": {
            "engine": "transformers serve --continuous-batching" if args.server is None else args.server,
            "concurrency": args.concurrency,
            "new_tokens": remote["new_tokens"],
            "seconds": remote["seconds"],
            "tokens_per_second": remote["new_tokens_per_second"],
        },
        "ratio": round(remote["new_tokens_per_second"] / local["new_tokens_per_second"], 2),
        "same_rows": same_rows,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
