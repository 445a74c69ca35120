"""Experiment tracking through accelerate's trackers, from the main process only.

`report_to` names the trackers: one, or several (`report_to=tensorboard,wandb` on the command line, a list
in a recipe), out of accelerate's own (`accelerate.utils.LoggerType`: tensorboard, wandb, trackio, mlflow,
comet_ml, aim, clearml, dvclive, swanlab), or `all` (every one of those installed here), or `none`
(tracking off). A name accelerate does not know is refused when the recipe is read; a tracker whose package
is not installed, when the run starts (before the target loads), naming the package to install.

Each tracker gets every train / eval record's numbers (loss, per-head or per-step accuracy, tau_sim, lr,
grad norm, throughput) as `train/...` and `eval/...` at the record's optimizer step, and the recipe as its
configuration; `wandb_project` is the project (or experiment) name of every tracker that takes one, and
`run_name` the run's name where one is taken (empty: the tracker picks it).
- wandb (the default): without WANDB_API_KEY the run is written offline under output_dir/wandb (`wandb
  sync` uploads it later); WANDB_MODE, when set, decides. A resumed run continues the same wandb run (its
  id is kept in the checkpoint).
- tensorboard (`pip install tensorboard`): event files in output_dir/logs/<wandb_project>/ (the recipe as
  hparams in a folder beside them). Each launch starts a new event file that purges the steps after the
  one it starts from, so a resumed run's events agree with metrics.jsonl, as a fresh run's do.
- aim keeps its repository in output_dir/logs, dvclive writes output_dir/dvclive (continued on resume),
  swanlab output_dir/swanlog; trackio, mlflow, comet_ml and clearml go where their own settings send them
  (environment variables, config files).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from specheads.core.atomic import naming_a_full_disk, write_text

NONE, ALL = "none", "all"
LOGS = "logs"  # accelerate's logging_dir under output_dir: tensorboard's and aim's
# PyPI's name for a tracker's package, where it is not the tracker's own
PIP_PACKAGES = {"comet_ml": "comet-ml"}


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _names(report_to: list[str] | str) -> list[str]:
    return [n for n in report_to.split(",") if n] if isinstance(report_to, str) else list(report_to)


def known_trackers() -> tuple[str, ...]:
    """accelerate's trackers, by the names `report_to` takes (`all` aside)."""
    from accelerate.utils import LoggerType  # lazy: accelerate is only needed once a run starts

    return tuple(str(t) for t in LoggerType if str(t) != ALL)


def report_to_problem(report_to: list[str] | str) -> str | None:
    """What is wrong with a recipe's `report_to`, or None: every name one of accelerate's trackers, `all`
    or `none`, and `none` alone."""
    names = _names(report_to)
    known = (*known_trackers(), ALL, NONE)
    unknown = [n for n in names if n not in known]
    if unknown:
        return (
            f"report_to names {'an unknown tracker' if len(unknown) == 1 else 'unknown trackers'} "
            f"{', '.join(map(repr, unknown))}: the trackers are {', '.join(known)} (several as a list, or "
            "'a,b' on the command line)"
        )
    if NONE in names and set(names) != {NONE}:
        return f"report_to 'none' turns tracking off and cannot be given with other trackers, got {names}"
    return None


def trackers(report_to: list[str] | str) -> list[str]:
    """The trackers a run starts, in order, each once: `all` is every tracker installed here, `none` (or
    an empty list) none. A tracker whose package is not installed is refused, naming the package."""
    from accelerate.tracking import get_available_trackers  # lazy: only a run needs accelerate

    installed = [str(t) for t in get_available_trackers()]
    names: list[str] = []
    for name in _names(report_to):
        for n in installed if name == ALL else [] if name == NONE else [name]:
            if n not in names:
                names.append(n)
    missing = [n for n in names if n not in installed]
    if missing:
        install = " ".join(PIP_PACKAGES.get(n, n) for n in missing)
        raise ValueError(
            f"report_to names {', '.join(map(repr, missing))}, whose package is not installed here: "
            f"`pip install {install}`, or leave {'it' if len(missing) == 1 else 'them'} out of report_to"
        )
    return names


def accelerator_kwargs(output_dir: str, report_to: list[str] | str) -> dict:
    """Accelerator's tracking arguments: the trackers, and output_dir as their project and logging folders."""
    from accelerate.utils import ProjectConfiguration  # lazy: accelerate is only needed once a run starts

    names = trackers(report_to)
    if not names:
        return {"log_with": None}
    folders = ProjectConfiguration(project_dir=output_dir, logging_dir=str(Path(output_dir) / LOGS))
    return {"log_with": names, "project_config": folders}


def init_kwargs(cfg, run_id: str, step: int) -> dict[str, dict]:
    """Each tracker's start-up arguments for a launch of `cfg` (a TrainConfig) from optimizer step `step`."""
    out, name = Path(cfg.output_dir), cfg.run_name or None
    named = (lambda key: {key: name}) if name else (lambda key: {})
    return {
        "wandb": {
            "dir": cfg.output_dir,
            "mode": wandb_mode(),
            "id": run_id,
            "resume": "allow",
            **named("name"),
        },
        # a new event file whose first event drops the steps after `step` that earlier files hold
        "tensorboard": {"purge_step": step + 1},
        "dvclive": {"dir": str(out / "dvclive"), "resume": step > 0},
        "swanlab": {"logdir": str(out / "swanlog"), **named("experiment_name")},
        "trackio": named("name"),
        "mlflow": named("run_name"),
        "clearml": named("task_name"),
    }


def hparams(config: dict) -> dict:
    """The recipe as tensorboard's hparams take it: numbers, strings and booleans (lists as JSON)."""
    return {
        k: v if isinstance(v, (bool, int, float, str)) else "" if v is None else json.dumps(v)
        for k, v in config.items()
    }


def start_tracking(accelerator, cfg, run_id: str, step: int = 0) -> None:
    """Start the trackers `make_accelerator` gave `accelerator` for `cfg` (a TrainConfig), launched from
    optimizer step `step` (0: a fresh run), and log the recipe to each (the main process's: the others
    hold none)."""
    if not accelerator.log_with:
        return
    if accelerator.is_main_process and "swanlab" in map(str, accelerator.log_with):
        (Path(cfg.output_dir) / "swanlog").mkdir(parents=True, exist_ok=True)  # swanlab wants it made
    accelerator.init_trackers(cfg.wandb_project, init_kwargs=init_kwargs(cfg, run_id, step))
    config = cfg.to_dict()
    for tracker in accelerator.trackers:
        tracker.store_init_configuration(hparams(config) if tracker.name == "tensorboard" else config)


def track(accelerator, split: str, record: dict, step: int) -> None:
    """Log a metrics record's numbers as `split/key`."""
    values = {f"{split}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
    accelerator.log(values, step=step)


def log_record(accelerator, path: Path, record: dict) -> None:
    """Append `record` to metrics.jsonl (main process) and send it to the trackers."""
    if accelerator.is_main_process:
        with naming_a_full_disk(path), path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    track(accelerator, record["split"], record, record["step"])


def keep_metrics_until(path: Path, step: int) -> None:
    """A fresh run starts metrics.jsonl empty; a resumed one keeps the records up to its step."""
    lines = path.read_text().splitlines() if step and path.is_file() else []
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    write_text(path, "".join(line + "\n" for line in kept))
