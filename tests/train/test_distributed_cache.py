"""`specheads cache` over several processes (`accelerate launch --config_file recipes/accelerate/ddp.yaml
--num_processes 2 -m specheads cache`: 2 CPU processes over gloo here):
each process writes its share of the shards, and the folder ends byte for byte as one process leaves it,
index.json included; a run killed part way resumes, with any number of processes, to the same bytes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from specheads.core.processes import Processes
from specheads.core.run_folder import LOCK_FILE
from specheads.core.target import FrozenTarget
from specheads.train.hidden_cache import RANK_GLOB, build_cache, read_index

from helpers import command, tiny_cache_args

cache_main = command("cache")
REPO = Path(__file__).resolve().parents[2]
MAX_LENGTH = 48
SHARD_TOKENS = "30"  # a shard or two a row: the runs are long enough to be killed part way

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def many_rows(tmp_path_factory) -> Path:
    """240 rows of cyclic text, 12 to 47 byte tokens each."""
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    rows = [{"text": (words[i % 4] * 8)[i % 7 :][: 10 + i % 36]} for i in range(240)]
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cache_args(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return tiny_cache_args(target, data, out, MAX_LENGTH, "--dtype", "float32", "--no-progress", *extra)


def launch_command(args: list[str], processes: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "recipes/accelerate/ddp.yaml"),
        "--num_processes", str(processes),
        "--main_process_port", str(free_port()), "-m", "specheads", "cache", *args,
    ]  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}


def launch(args: list[str]) -> str:
    result = subprocess.run(
        launch_command(args), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_same_folder(one: Path, two: Path) -> None:
    a, b = folder_bytes(one), folder_bytes(two)
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == []


@pytest.fixture(scope="module")
def one_process_cache(llama_dir, many_rows, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "cache"
    assert cache_main(cache_args(llama_dir, many_rows, out, "--shard-tokens", SHARD_TOKENS)) == 0
    return out


@pytest.mark.slow
def test_two_processes_write_the_one_process_cache(llama_dir, many_rows, one_process_cache, tmp_path):
    """2 CPU processes, the target placed by --device-map auto: the same files, byte for byte."""
    out = tmp_path / "cache"
    printed = launch(
        cache_args(llama_dir, many_rows, out, "--shard-tokens", SHARD_TOKENS, "--device-map", "auto")
    )
    index = read_index(out / "train")
    assert index["complete"] and len(index["shards"]) > 10
    assert f"{len(index['shards'])} written, 0 already there" in printed  # printed once, by process 0
    assert printed.count("train:") == 1
    assert_same_folder(one_process_cache, out)


@pytest.mark.slow
def test_a_killed_two_process_cache_resumes_to_the_same_bytes(
    llama_dir, many_rows, one_process_cache, tmp_path
):
    """Killed (SIGKILL, every process) once both processes have written shards; rerun on 2 processes, it
    writes only the rest; the folder is then the one-process cache. A second kill, resumed on 1 process,
    ends the same."""
    out = tmp_path / "cache"
    args = cache_args(llama_dir, many_rows, out, "--shard-tokens", SHARD_TOKENS)

    def killed_part_way() -> int:
        proc = subprocess.Popen(
            launch_command(args), cwd=REPO, env=ENV,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                recorded = [json.loads(p.read_text()) for p in (out / "train").glob(RANK_GLOB)]
                if len(recorded) == 2 and all(len(r["shards"]) >= 2 for r in recorded):
                    break
                time.sleep(0.002)
        finally:
            if proc.poll() is None:  # the launcher puts each worker in a new process group of its own
                workers = psutil.Process(proc.pid).children(recursive=True)
                for worker in [*workers, psutil.Process(proc.pid)]:
                    worker.kill()
                while not all(gone_or_zombie(w) for w in workers):
                    time.sleep(0.01)
                wait_for_lock_release(out)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed part way"
        return sum(len(json.loads(p.read_text())["shards"]) for p in (out / "train").glob(RANK_GLOB))

    done = killed_part_way()
    assert not read_index(out / "train")["complete"]
    printed = launch(args)
    total = len(read_index(out / "train")["shards"])
    skipped = int(printed.split("train: ")[1].split(" written, ")[1].split(" already")[0])
    assert skipped >= done >= 4 and total > skipped  # what was finished was kept, the rest written
    assert_same_folder(one_process_cache, out)  # the index-rank files are gone too

    for shard in (out / "train").glob("shard-*"):  # once more, resumed on one process
        shard.unlink()
    (out / "train" / "index.json").unlink()
    killed_part_way()
    assert cache_main(args) == 0
    assert_same_folder(one_process_cache, out)


def test_device_map_reaches_from_pretrained(llama_dir, many_rows, one_process_cache, tmp_path, monkeypatch):
    """--device-map auto loads the target through transformers' device_map (on this CPU: every layer on
    the CPU; no GPU share to limit it to), and the cache is the same."""
    loaded = []
    original = FrozenTarget.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        target = original(cls, *args, **kwargs)
        loaded.append((kwargs.get("device_map"), kwargs.get("max_memory"), target.device))
        return target

    monkeypatch.setattr(FrozenTarget, "from_pretrained", classmethod(spy))
    out = tmp_path / "cache"
    assert (
        cache_main(
            cache_args(llama_dir, many_rows, out, "--shard-tokens", SHARD_TOKENS, "--device-map", "auto")
        )
        == 0
    )
    assert loaded == [("auto", None, torch.device("cpu"))]
    assert_same_folder(one_process_cache, out)


def wait_for_lock_release(folder: Path, timeout: float = 60.0) -> None:
    """Until the killed run's folder lock is free. A killed process's leader thread shows as a zombie
    while its other threads are still exiting, holding its files (and so its flock) until the last one
    has gone."""
    import fcntl

    lock, deadline = folder / LOCK_FILE, time.monotonic() + timeout
    while lock.exists() and time.monotonic() < deadline:
        with lock.open("rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            fcntl.flock(f, fcntl.LOCK_UN)
            return
    assert not lock.exists() or time.monotonic() < deadline, f"{lock} still held {timeout} s after the kill"


def gone_or_zombie(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cache_as(rank: int, world: int, target_dir: str, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        target = FrozenTarget.from_pretrained(target_dir, dtype="float32")
        rows = synthetic_rows()
        build_cache(
            target, rows, (1, -1), out, max_length=MAX_LENGTH, dtype=torch.float32, shard_tokens=100,
            batch_size=3, progress=False, processes=Processes(rank=rank, world=world),
        )  # fmt: skip
    finally:
        torch.distributed.destroy_process_group()


def synthetic_rows() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(60):
        n = 5 + i % 40
        rows.append({"input_ids": torch.randint(0, 260, (n,), generator=g).tolist(), "loss_mask": [1] * n})
    return rows


def test_build_cache_on_two_processes_equals_one(llama_dir, tmp_path):
    """build_cache itself, shared by 2 gloo processes (torch.multiprocessing) against one: the same bytes,
    and no per-process files left."""
    target = FrozenTarget.from_pretrained(str(llama_dir), dtype="float32")
    one = tmp_path / "one"
    summary = build_cache(
        target, synthetic_rows(), (1, -1), one, max_length=MAX_LENGTH, dtype=torch.float32, shard_tokens=100,
        batch_size=3, progress=False,
    )  # fmt: skip
    two = tmp_path / "two"
    torch.multiprocessing.spawn(_cache_as, args=(2, str(llama_dir), str(two), free_port()), nprocs=2)
    assert summary["shards"] > 4
    assert_same_folder(one, two)
