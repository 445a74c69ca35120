"""Experiment tracking through accelerate's trackers: `report_to` takes one or several of them, tensorboard
writes real event files whose scalars are metrics.jsonl's records step for step (a resumed run's too), and
a tracker that is unknown or not installed stops the command before any model loads."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from specheads.cli import main as cli_main
from specheads.methods import methods
from specheads.train import loop
from specheads.train.recipe import load_config
from specheads.train.tracking import known_trackers, trackers

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"


def args(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        str(RECIPE),
        f"target={target}",
        f"data={data}",
        "max_length=64",
        "batch_size=8",
        "num_heads=2",
        "max_steps=4",
        "eval_fraction=0.1",
        "eval_data=[]",
        "eval_every=2",
        "eval_batches=1",
        "log_every=1",
        f"output_dir={out}",
        *extra,
        "--no-progress",
    ]


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag tensorboard reads from the run's event files: [(step, value)], in step order."""
    events = EventAccumulator(str(out / "logs" / "specheads"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def expected(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's numbers as tensorboard holds them: `split/key`, float32."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for k, v in r.items():
            if isinstance(v, (int, float)) and k != "step":
                out.setdefault(f"{r['split']}/{k}", []).append((r["step"], float(np.float32(v))))
    return out


def test_report_to_takes_names_lists_all_and_none(tmp_path):
    assert load_config(None, methods=methods()).report_to == ["wandb"]
    assert load_config(None, ["report_to=tensorboard,wandb"], methods=methods()).report_to == [
        "tensorboard",
        "wandb",
    ]
    recipe = tmp_path / "r.yaml"
    recipe.write_text("report_to:\n  - tensorboard\n  - wandb\n")
    assert load_config(recipe, methods=methods()).report_to == ["tensorboard", "wandb"]
    assert trackers(["wandb", "tensorboard", "wandb"]) == ["wandb", "tensorboard"]
    assert trackers(["none"]) == trackers([]) == []
    assert set(trackers(["all"])) >= {"tensorboard", "wandb"}  # both installed with the dev extra
    # accelerate's own list of trackers, whatever is installed
    assert {"tensorboard", "wandb", "mlflow", "trackio", "comet_ml", "aim", "dvclive"} <= set(
        known_trackers()
    )


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "tensorbord",
            r"report_to names an unknown tracker 'tensorbord': the trackers are .*tensorboard.*wandb",
        ),
        ("[wandb, nope, zzz]", "report_to names unknown trackers 'nope', 'zzz'"),
        ("none,wandb", "report_to 'none' turns tracking off and cannot be given with other trackers"),
    ],
)
def test_a_bad_report_to_is_refused_before_any_model_loads(
    value, message, tiny_target_dirs, text_data, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(loop, "set_up", lambda *a, **k: pytest.fail("the run went on to load the model"))
    out = tmp_path / "run"
    argv = args(tiny_target_dirs["llama"], text_data, out, f"report_to={value}")
    monkeypatch.setattr(sys, "argv", ["specheads", *argv])  # as the console script runs
    capsys.readouterr()
    assert cli_main() == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line.startswith("specheads train: error: bad recipe value: ")
    assert re.search(message, line), line
    assert not out.exists()


def test_a_tracker_not_installed_names_its_package_before_any_model_loads(
    tiny_target_dirs, text_data, tmp_path, monkeypatch, capsys
):
    import accelerate.tracking
    from accelerate.utils import LoggerType

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [LoggerType.WANDB])
    monkeypatch.setattr(loop, "set_up", lambda *a, **k: pytest.fail("the run went on to load the model"))
    out = tmp_path / "run"
    extra = ("report_to=[wandb, tensorboard, comet_ml]",)
    monkeypatch.setattr(sys, "argv", ["specheads", *args(tiny_target_dirs["llama"], text_data, out, *extra)])
    capsys.readouterr()
    assert cli_main() == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line == (
        "specheads train: error: report_to names 'tensorboard', 'comet_ml', whose package is not installed "
        "here: `pip install tensorboard comet-ml`, or leave them out of report_to"
    )
    assert not out.exists()


def test_tensorboard_event_files_hold_the_metrics_and_a_resume_continues_them(
    tiny_target_dirs, text_data, tmp_path
):
    out = tmp_path / "run"
    argv = args(tiny_target_dirs["llama"], text_data, out, "report_to=tensorboard", "save_every=2")
    assert cli_main(argv) == 0
    first = read_metrics(out)
    assert [(r["split"], r["step"]) for r in first] == [
        ("train", 1),
        ("train", 2),
        ("eval", 2),
        ("train", 3),
        ("train", 4),
        ("eval", 4),
    ]
    logged = scalars(out)
    assert logged == expected(first)
    for tag in ("train/loss", "train/head0/top1", "train/head1/top5", "train/tau_sim", "train/lr"):
        assert [step for step, _ in logged[tag]] == [1, 2, 3, 4], tag
    assert [step for step, _ in logged["eval/tau_sim"]] == [2, 4]
    assert not (out / "wandb").exists()
    # the recipe beside the events, as tensorboard's hparams
    (hparams,) = (out / "logs" / "specheads").glob("*/hparams.yml")
    assert "max_steps: 4" in hparams.read_text() and "report_to: '[\"tensorboard\"]'" in hparams.read_text()

    # A resumed launch from step 2 logs steps 3 and 4 again into a new event file; its first event purges
    # the first launch's steps after 2, so tensorboard holds each step once, as metrics.jsonl does.
    assert cli_main([*argv[:-1], "resume=auto", "--no-progress"]) == 0
    assert len(list((out / "logs" / "specheads").glob("events.out.tfevents.*"))) == 2
    resumed = read_metrics(out)
    assert [(r["split"], r["step"]) for r in resumed] == [(r["split"], r["step"]) for r in first]
    assert scalars(out) == expected(resumed)


def test_tensorboard_and_wandb_together(tiny_target_dirs, text_data, tmp_path, monkeypatch):
    """A YAML list of two trackers starts both: tensorboard's events and an offline wandb run."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    extra = ("report_to=[tensorboard, wandb]", "max_steps=2", "run_name=both")
    assert cli_main(args(tiny_target_dirs["llama"], text_data, out, *extra)) == 0
    records = read_metrics(out)
    assert [(r["split"], r["step"]) for r in records] == [("train", 1), ("train", 2), ("eval", 2)]
    assert scalars(out) == expected(records)
    (run,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    assert run.stat().st_size > 0


def test_two_processes_write_one_tensorboard_run(tiny_target_dirs, text_data, tmp_path):
    """Under `accelerate launch` with 2 processes the main one alone writes events: one event file, whose
    scalars are metrics.jsonl's."""
    out = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate" / "ddp.yaml"),
        "--num_processes", "2", "--main_process_port", str(port),
        "-m", "specheads.train", *args(tiny_target_dirs["llama"], text_data, out, "report_to=tensorboard")[1:],
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    records = read_metrics(out)
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4]
    assert len(list((out / "logs" / "specheads").glob("events.out.tfevents.*"))) == 1
    assert scalars(out) == expected(records)
