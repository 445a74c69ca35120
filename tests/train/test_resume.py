"""Long runs survive interruption: a resumed run ends with bit-identical heads, a SIGTERM or Ctrl-C saves
and stops cleanly, and a kill in the middle of a save never leaves a checkpoint that resume would pick up."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specheads.cli import main as cli_main
from specheads.methods import methods
from specheads.train import checkpointing
from specheads.train.checkpointing import check_resumable, checkpoint_steps, latest_checkpoint, read_state
from specheads.train.optimizers import newton_schulz_dtype
from specheads.train.recipe import load_config
from specheads.train.sampler import EpochBatches

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")


def run_args(recipe: str, target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        str(REPO / "recipes" / "tiny" / recipe),
        f"target={target}",
        f"data={data}",
        "max_length=48",
        "batch_size=8",
        "lr=0.01",
        "warmup_steps=2",
        "eval_fraction=0.1",
        "eval_data=[]",  # the recipe evaluates on stdlib; these runs on a split of their data
        "eval_batches=2",
        "log_every=1",
        "report_to=none",
        f"output_dir={out}",
        *extra,
    ]


def train(*args: str) -> None:
    assert cli_main(["train", *args, "--no-progress"]) == 0


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


def assert_bit_identical(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


def records(out: Path) -> list[dict]:
    """metrics.jsonl without the throughput (a clock reading)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "labels_per_second"} for r in rows]


@pytest.mark.parametrize(
    "recipe, extra",
    [
        ("medusa.yaml", ("num_heads=3", "labels=data")),
        ("eagle.yaml", ("noise=0.1", "grad_accum=2")),  # input noise: the RNG states must come back
        ("eagle3.yaml", ("optimizer=muon", "ttt_steps=2")),  # both optimizers' states must come back
    ],
    ids=["medusa", "eagle-noise-accum", "eagle3-muon"],
)
def test_resumed_run_ends_bit_identical(recipe, extra, tiny_target_dirs, text_data, tmp_path):
    args = (recipe, tiny_target_dirs["llama"], text_data)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    # 114 training rows, batch 8: 14 batches an epoch. The checkpoint at step 9 sits mid-epoch, and the
    # resumed run crosses an epoch boundary (a reshuffle)
    train(*run_args(*args, full, "max_steps=16", "save_every=9", "eval_every=8", *extra))
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step-9", resumed / "checkpoints" / "step-9")
    shutil.copy(full / "metrics.jsonl", resumed / "metrics.jsonl")  # holds records past step 9: dropped
    train(*run_args(*args, resumed, "max_steps=16", "save_every=9", "eval_every=8", "resume=auto", *extra))
    assert_bit_identical(full, resumed)
    assert records(full) == records(resumed)
    summary = json.loads((resumed / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith("step-9") and summary["completed"]
    # the Newton-Schulz dtype muon_dtype "auto" chose on this machine; no Muon, none
    muon = (
        load_config(str(REPO / "recipes" / "tiny" / recipe), list(extra), methods=methods()).optimizer
        == "muon"
    )
    dtype = newton_schulz_dtype(torch.device("cpu")) if muon else None
    assert summary["muon_newton_schulz_dtype"] == (dtype and str(dtype).removeprefix("torch."))
    launch = json.loads((resumed / "provenance.jsonl").read_text().splitlines()[-1])
    assert launch["resumed_from"].endswith("step-9")


@pytest.fixture(scope="module")
def uninterrupted(tiny_target_dirs, text_data, tmp_path_factory) -> Path:
    out, threads = tmp_path_factory.mktemp("uninterrupted"), torch.get_num_threads()
    torch.set_num_threads(1)
    train(*sigterm_args(tiny_target_dirs, text_data, out))
    torch.set_num_threads(threads)
    return out


def sigterm_args(tiny_target_dirs, text_data, out: Path, *extra: str) -> list[str]:
    return run_args(
        "medusa.yaml", tiny_target_dirs["llama"], text_data, out,
        "batch_size=4", "num_heads=2", "labels=data", "max_steps=120", "eval_every=1000", "save_every=25", "keep_checkpoints=2",
        *extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    "signum, code",
    [(signal.SIGTERM, 143), (signal.SIGINT, 130)],  # Ctrl-C used to save nothing and exit 130 at once
    ids=["sigterm", "sigint"],
)
def test_sigterm_saves_stops_and_resume_auto_finishes_identically(
    uninterrupted, tiny_target_dirs, text_data, tmp_path, signum, code
):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [
        sys.executable,
        "-m",
        "specheads.train",
        *sigterm_args(tiny_target_dirs, text_data, out),
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == code, stderr[-3000:]  # unfinished, not 0: the run did not complete
    summary = json.loads((out / "train_summary.json").read_text())
    stopped = summary["last_step"]
    assert not summary["completed"] and 3 <= stopped < 120, summary
    name = signal.Signals(signum).name
    assert summary["stopped_by"] == name and summary["exit_code"] == code
    assert f"stopped by {name} after step {stopped}" in stdout and "resume=auto" in stdout
    assert latest_checkpoint(out).name == f"step-{stopped}"
    assert not (out / "model.safetensors").exists()  # an unfinished run writes no final heads

    train(*sigterm_args(tiny_target_dirs, text_data, out, "resume=auto"))
    assert_bit_identical(uninterrupted, out)
    assert len(checkpoint_steps(out)) <= 2  # keep_checkpoints=2
    assert records(uninterrupted) == records(out)


def test_a_sigterm_during_set_up_saves_after_the_first_step(
    tiny_target_dirs, text_data, tmp_path, monkeypatch
):
    """SIGTERM while the run sets up (the target loading, before the first step): it is taken already, so the
    run trains one step, saves it and exits 143. It used to kill the process outright, leaving an empty
    metrics.jsonl and no checkpoint (and a test that sent it once metrics.jsonl existed flaky)."""
    from specheads.train import loop

    real_set_up = loop.set_up

    def set_up_then_sigterm(*args, **kwargs):
        run = real_set_up(*args, **kwargs)
        # only into a handler: the default action would end pytest itself rather than fail this test
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None), (
            "SIGTERM not taken"
        )
        os.kill(os.getpid(), signal.SIGTERM)
        return run

    monkeypatch.setattr(loop, "set_up", set_up_then_sigterm)
    out = tmp_path / "run"
    assert cli_main(["train", *sigterm_args(tiny_target_dirs, text_data, out), "--no-progress"]) == 143
    summary = json.loads((out / "train_summary.json").read_text())
    assert not summary["completed"] and summary["last_step"] == 1, summary
    assert latest_checkpoint(out).name == "step-1"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handed back when the run ends


def test_a_kill_mid_save_leaves_nothing_that_resume_takes(
    uninterrupted, tiny_target_dirs, text_data, tmp_path, monkeypatch
):
    """The save of step 50 dies after the optimizer state was written and before the heads were: resume
    takes step 25, and the run still ends where the uninterrupted one did."""
    out = tmp_path / "run"
    real_save_heads = checkpointing.save_heads

    class Killed(Exception):
        pass

    def dies_at_step_50(heads, path, *args, **kwargs):
        if Path(path).name == ".tmp-step-50":
            raise Killed
        return real_save_heads(heads, path, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "save_heads", dies_at_step_50)
    with pytest.raises(Killed):
        train(*sigterm_args(tiny_target_dirs, text_data, out))
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == [".tmp-step-50", "step-25"]
    assert (out / "checkpoints" / ".tmp-step-50" / "accelerate" / "optimizer.bin").is_file()
    assert latest_checkpoint(out).name == "step-25"

    monkeypatch.setattr(checkpointing, "save_heads", real_save_heads)
    train(*sigterm_args(tiny_target_dirs, text_data, out, "resume=auto"))
    assert_bit_identical(uninterrupted, out)
    assert not list((out / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize("recorded", [True, False], ids=["hashed", "older-checkpoint"])
def test_a_damaged_checkpoint_is_refused_naming_the_file(
    uninterrupted, tiny_target_dirs, text_data, tmp_path, recorded
):
    """accelerate skips RNG states it cannot load: a resume from a checkpoint whose random_states_0.pkl was
    damaged exited 0 with other weights. Every file is checked against the sha256 its trainer state
    recorded (a checkpoint from before that: the RNG states must load), and the file is named."""
    step, path = checkpoint_steps(uninterrupted)[-1]
    out = tmp_path / "run"
    shutil.copytree(path, out / "checkpoints" / path.name)
    state_file = out / "checkpoints" / path.name / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert set(state["files"]) >= {"model.safetensors", "accelerate/random_states_0.pkl"}
    if not recorded:
        state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "files"}))
    rng = out / "checkpoints" / path.name / "accelerate" / "random_states_0.pkl"
    rng.write_bytes(rng.read_bytes()[:40])
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    with pytest.raises(ValueError, match=f"{rng}.*(damaged|cannot be read)"):
        train(*sigterm_args(tiny_target_dirs, text_data, out, "resume=auto"))
    assert sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file()) == before


def test_resume_refuses_a_different_run(uninterrupted, tiny_target_dirs, text_data):
    path = latest_checkpoint(uninterrupted)
    state = read_state(path)
    cfg = load_config(None, state["config"], methods=methods())
    entry = methods()[cfg.method]
    record = checkpointing.TargetRecord.from_dict(json.loads((path / "config.json").read_text())["target"])
    check_resumable(
        state,
        load_config(None, {**state["config"], "max_steps": 500}, methods=methods()),
        1,
        record,
        path,
        method=entry,
    )  # allowed
    with pytest.raises(ValueError, match=r"cannot resume .*\n  lr: checkpoint 0.01, this run 0.02"):
        check_resumable(
            state,
            load_config(None, {**state["config"], "lr": 0.02}, methods=methods()),
            1,
            record,
            path,
            method=entry,
        )
    with pytest.raises(ValueError, match="written by 1 processes, this run has 2"):
        check_resumable(state, cfg, 2, record, path, method=entry)


def test_a_resume_may_change_the_label_floors_and_is_checked_against_its_own(
    uninterrupted, tiny_target_dirs, text_data, tmp_path
):
    """min_label_tokens and min_label_tokens_per_row only gate the start (RESUMABLE_CHANGES): a resume with
    lower floors ends bit-identical, and one with a floor its data misses stops with the numbers."""
    step, path = checkpoint_steps(uninterrupted)[0]
    out = tmp_path / "run"
    shutil.copytree(path, out / "checkpoints" / path.name)
    with pytest.raises(ValueError, match=r"label tokens in .* rows .*min_label_tokens=1000000000 in total"):
        train(*sigterm_args(tiny_target_dirs, text_data, out, "resume=auto", "min_label_tokens=1000000000"))
    assert latest_checkpoint(out).name == f"step-{step}"  # refused before anything was written
    floors = ("min_label_tokens=0", "min_label_tokens_per_row=0")
    train(*sigterm_args(tiny_target_dirs, text_data, out, "resume=auto", *floors))
    assert json.loads((out / "train_summary.json").read_text())["resumed_from"].endswith(f"step-{step}")
    assert_bit_identical(uninterrupted, out)


def test_a_second_ctrl_c_quits_at_once(capfd):
    """The first SIGINT asks for a save after the step (and says so); the second raises at once."""
    with checkpointing.StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signal_name == "SIGINT" and stop.exit_code() == 130
        assert "Ctrl-C again quits at once" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs between bytecodes: at once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back


def test_resume_names_a_missing_checkpoint(tmp_path, capsys):
    from specheads.train.checkpointing import resolve_resume

    assert (
        resolve_resume(load_config(None, {"resume": "auto", "output_dir": str(tmp_path)}, methods=methods()))
        is None
    )
    # a run told to resume that finds nothing says so, naming the folder (it used to start from 0 silently)
    cfg = load_config(None, {"resume": "auto", "output_dir": str(tmp_path)}, methods=methods())
    assert resolve_resume(cfg, announce=True) is None
    assert f"resume=auto: no checkpoint in {tmp_path / 'checkpoints'}" in capsys.readouterr().err
    (tmp_path / "checkpoints" / "step-7").mkdir(parents=True)  # no trainer_state.json: not whole
    with pytest.raises(FileNotFoundError, match="is not a whole checkpoint"):
        resolve_resume(
            load_config(None, {"resume": str(tmp_path / "checkpoints" / "step-7")}, methods=methods())
        )
    assert latest_checkpoint(tmp_path) is None


def test_batches_resume_at_any_position():
    fresh = iter(EpochBatches(10, 3, seed=1))
    drawn = [next(fresh) for _ in range(12)]  # 3 batches an epoch: four epochs
    for position in range(12):
        resumed = iter(EpochBatches(10, 3, seed=1, start=position))
        assert [next(resumed) for _ in range(12 - position)] == drawn[position:]
    assert drawn[:3] != drawn[3:6]  # reshuffled every epoch
