"""Experiment tracking: wandb through accelerate's tracker, from the main process only.

`report_to: wandb` (the default) logs every train / eval record (loss, per-head or per-step accuracy,
tau_sim, lr, grad norm, throughput) under `train/...` and `eval/...`. Without WANDB_API_KEY the run is
written offline under output_dir/wandb (`wandb sync` uploads it later); WANDB_MODE, when set, decides.
A resumed run continues the same wandb run (its id is kept in the checkpoint). `report_to: none` turns
tracking off.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from specheads.core.atomic import naming_a_full_disk, write_text
from specheads.train.config import TrainConfig


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def start_tracking(accelerator, cfg: TrainConfig, run_id: str) -> None:
    if cfg.report_to != "wandb":
        return
    settings = {"dir": cfg.output_dir, "mode": wandb_mode(), "id": run_id, "resume": "allow"}
    if cfg.run_name:
        settings["name"] = cfg.run_name
    accelerator.init_trackers(cfg.wandb_project, config=cfg.to_dict(), init_kwargs={"wandb": settings})


def track(accelerator, split: str, record: dict, step: int) -> None:
    """Log a metrics record's numbers as `split/key`."""
    values = {f"{split}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
    accelerator.log(values, step=step)


def log_record(accelerator, path: Path, record: dict) -> None:
    """Append `record` to metrics.jsonl (main process) and send it to the tracker."""
    if accelerator.is_main_process:
        with naming_a_full_disk(path), path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    track(accelerator, record["split"], record, record["step"])


def keep_metrics_until(path: Path, step: int) -> None:
    """A fresh run starts metrics.jsonl empty; a resumed one keeps the records up to its step."""
    lines = path.read_text().splitlines() if step and path.is_file() else []
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    write_text(path, "".join(line + "\n" for line in kept))
