"""Checkpoints that resume exactly, written so that a kill never leaves a half checkpoint behind.

    output_dir/checkpoints/step-N/
        config.json, model.safetensors   the heads: a native head checkpoint (load_heads, export read it)
        trainer_state.json               step, data position, the unlogged metric window, processes, recipe
        accelerate/                      accelerator.save_state: optimizer, schedule, each process's RNG
                                         states (python, numpy, torch, cuda); under DeepSpeed or FSDP also
                                         the heads' (sharded) weights and optimizer in their own layout

Atomic: every process writes into checkpoints/.tmp-step-N/; when all are done the main process renames it
to step-N/, so a directory named step-N is whole. `resume: auto` takes the highest whole step-N and never
looks at .tmp-* (a kill mid-save leaves only a temporary directory, removed by the next save).

Exact: weights, AdamW moments, the schedule, the RNG states and the data position (global batches drawn,
see train/sampler.py) are what an uninterrupted run holds after step N, so the resumed run continues
bit for bit. It needs the same number of processes (each has its own RNG state).

SIGTERM (a scheduler's preemption, torchrun passing on a kill) and SIGINT (Ctrl-C) set a flag; the loop
finishes its step, saves a checkpoint and returns; `specheads train` then prints how to resume and exits
with the code a shell reports for a process that signal ended (143 for SIGTERM, INTERRUPTED_EXIT_CODE; 130
for SIGINT), never 0: the run is not finished. A second Ctrl-C quits at once (the last checkpoint stays).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from specheads.core.atomic import naming_a_full_disk
from specheads.core.confined import confined
from specheads.core.run_folder import clear, hold_folder, refuse_results
from specheads.core.target import TargetRecord
from specheads.heads import read_head_config, save_heads
from specheads.heads.checkpoint import ADAPTER_DIR, CONFIG_FILE, WEIGHTS_FILE, read_weights, sha256_file
from specheads.heads.method import Method
from specheads.train.config import TrainConfig
from specheads.train.distributed import zero_stage
from specheads.train.recipe import config_from_record

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
ACCELERATE_STATE = "accelerate"
INTERRUPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STEP_DIR = re.compile(r"step-(\d+)")
# Recipe keys a resumed run may change: they decide what is logged or kept, or where, not the numbers.
# (max_steps moves the end, and with it the cosine schedule from the resumed step on.)
RESUMABLE_CHANGES = {
    "resume",
    "output_dir",
    "target",  # the same model at another path; its record is checked instead
    "max_steps",
    "log_every",
    "eval_every",
    "eval_batches",
    "save_every",
    "keep_checkpoints",
    "report_to",
    "wandb_project",
    "run_name",
    "num_workers",
    "allow_target_mismatch",
    # the label-token floors decide whether a run starts, not what it computes (the rows, their masks and
    # their order are the same whatever the floors): a resumed run is checked against its own
    "min_label_tokens",
    "min_label_tokens_per_row",
}


# What a training run writes into output_dir: a fresh run refuses a folder holding another's, `--overwrite`
# removes them (other files stay), `resume` continues them.
RUN_OUTPUTS = (
    CHECKPOINTS,
    "metrics.jsonl",
    "train_summary.json",
    "provenance.jsonl",
    CONFIG_FILE,
    WEIGHTS_FILE,
    ADAPTER_DIR,
)


@contextmanager
def claim_output_dir(cfg: TrainConfig, main: bool, overwrite: bool = False) -> Iterator[None]:
    """Own `cfg.output_dir` for the run (the main process: the others write only what it tells them).

    Before anything expensive: the folder must be writable and free (a second run on it stops at once,
    naming the first), and hold no other run's results unless this run resumes them or `overwrite`
    clears them; stale checkpoints of an old run would otherwise be what a later `resume=auto` picks.
    """
    if overwrite and cfg.resume:
        raise ValueError(
            f"--overwrite deletes the checkpoints resume={cfg.resume!r} would continue: pass one"
        )
    if not main:
        yield
        return
    out = Path(cfg.output_dir)
    with hold_folder(out, "output_dir"):
        if overwrite:
            clear(out, RUN_OUTPUTS)
        elif not cfg.resume:
            refuse_results(
                out,
                RUN_OUTPUTS,
                "continue it with resume=auto, or pass --overwrite to start over (deletes them)",
            )
        yield


# -- finding checkpoints ----------------------------------------------------------------------------


def checkpoint_steps(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every whole checkpoint under output_dir, oldest first."""
    root = Path(output_dir) / CHECKPOINTS
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        match = _STEP_DIR.fullmatch(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    steps = checkpoint_steps(output_dir)
    return steps[-1][1] if steps else None


def resolve_resume(cfg: TrainConfig, announce: bool = False) -> Path | None:
    """The checkpoint `cfg.resume` names: "" none, "auto" the latest whole one (none on a fresh output_dir:
    `announce` says so on stderr), or a checkpoint directory, which must be whole."""
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        found = latest_checkpoint(cfg.output_dir)
        if found is None and announce:
            print(
                f"resume=auto: no checkpoint in {Path(cfg.output_dir) / CHECKPOINTS} to resume; "
                "starting from step 0",
                file=sys.stderr,
                flush=True,
            )
        return found
    path = Path(cfg.resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"resume={cfg.resume!r} is not a whole checkpoint (no {STATE_FILE} in it)")
    return path


def read_state(path: Path) -> dict:
    """A checkpoint's trainer_state.json; a damaged one is an error naming it."""
    file = Path(path) / STATE_FILE
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON ({e}): a damaged checkpoint; {_ANOTHER}") from None
    if not isinstance(state, dict) or not {"step", "config", "num_processes"} <= set(state):
        raise ValueError(f"{file} is not a trainer state (no step, config or num_processes); {_ANOTHER}")
    return state


_ANOTHER = "resume from another checkpoint (resume=DIR), or delete this one"


def checkpoint_files(path: Path) -> dict[str, str]:
    """sha256 of every file of a checkpoint folder but its trainer state (which records them), by path
    relative to the folder."""
    return {
        f.relative_to(path).as_posix(): sha256_file(f)
        for f in sorted(Path(path).rglob("*"))
        if f.is_file() and f.name != STATE_FILE
    }


def verify_checkpoint(path: Path, state: dict, process_index: int) -> None:
    """Refuse a checkpoint any part of which is missing or damaged, naming the file: each file against the
    sha256 its trainer state recorded (checkpoints written before that record: the heads' weights and this
    process's RNG states must read, which accelerate's load_state would skip silently)."""
    path = Path(path)
    recorded = state.get("files")
    if isinstance(recorded, dict):
        for name, want in sorted(recorded.items()):
            file = confined(path, name, path / STATE_FILE, '"files" entry', follow_links=False)
            if not file.is_file():
                raise ValueError(
                    f"{file} is missing from the checkpoint (its {STATE_FILE} lists it); {_ANOTHER}"
                )
            got = sha256_file(file)
            if got != want:
                raise ValueError(
                    f"{file} is damaged (sha256 {got[:12]}…, written as {want[:12]}…): the checkpoint cannot "
                    f"resume exactly; {_ANOTHER}"
                )
        return
    read_weights(path / WEIGHTS_FILE)
    rng = path / ACCELERATE_STATE / f"random_states_{process_index}.pkl"
    try:
        from accelerate.utils.other import load  # lazy: accelerate is only needed once a run starts

        states = load(rng)
        if not isinstance(states, dict) or not {"random_state", "torch_manual_seed"} <= set(states):
            raise ValueError("not the RNG states accelerate writes")
    except Exception as e:  # noqa: BLE001 - whatever it is, the run would not continue exactly
        raise ValueError(
            f"{rng} cannot be read ({_brief(e)}): the random states of a damaged checkpoint; {_ANOTHER}"
        ) from None


def _brief(e: BaseException) -> str:
    """An error's first line, without torch's advice to unpickle untrusted objects."""
    if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e):
        return "it holds objects specheads will not load: only tensors and plain values are read"
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _flat(config: dict) -> dict:
    """A recipe's keys, its method's section's as `method.key`."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= {f"{key}.{k}": v for k, v in value.items()}
        else:
            out[key] = value
    return out


def check_resumable(
    state: dict, cfg: TrainConfig, num_processes: int, record: TargetRecord, path: Path, *, method: Method
) -> None:
    """Refuse to resume a checkpoint whose run differs from this one in anything but RESUMABLE_CHANGES, or
    whose heads are not the ones `method` (`cfg.method`'s entry) trains."""
    problems = []
    if state["num_processes"] != num_processes:
        problems.append(f"written by {state['num_processes']} processes, this run has {num_processes}")
    recorded = dict(state["config"])
    if recorded.get("method") != cfg.method:
        raise ValueError(
            f"cannot resume {path} exactly:\n  method: checkpoint {recorded.get('method')!r}, this run {cfg.method!r}"
        )
    then_cfg = config_from_record(recorded, methods={cfg.method: method})  # sectioned, or flat as before
    section = recorded.get(cfg.method) if isinstance(recorded.get(cfg.method), dict) else recorded
    if hasattr(then_cfg.settings, "draft_arch") and "draft_arch" not in section:
        then_cfg.settings.draft_arch = "target"  # written before draft_arch: the target's own layer
    now, then = _flat(cfg.to_dict()), _flat(then_cfg.to_dict())
    for key, value in then.items():
        if key not in RESUMABLE_CHANGES and now.get(key) != value:
            problems.append(f"{key}: checkpoint {value!r}, this run {now.get(key)!r}")
    if problems:
        raise ValueError(f"cannot resume {path} exactly:\n  " + "\n  ".join(problems))
    # the heads name their class's method (Medusa-2 trains and saves Medusa heads)
    heads_config = read_head_config(
        path, methods={method.name, getattr(method.head_class, "method", method.name)}
    )
    TargetRecord.from_dict(heads_config["target"]).check_matches(
        record, what=f"heads in {path}", allow_weights=cfg.allow_target_mismatch
    )


# -- saving and loading ----------------------------------------------------------------------------


def weights_sharded(accelerator) -> bool:
    """Whether the heads' weights are split over processes (ZeRO-3, FSDP)."""
    from accelerate.utils import DistributedType  # lazy: accelerate is only needed once a run starts

    return accelerator.distributed_type == DistributedType.FSDP or zero_stage(accelerator) == 3


def heads_for_saving(accelerator, model) -> nn.Module | None:
    """The heads with whole weights on the main process (None elsewhere). Every process must call it:
    under ZeRO-3 or FSDP the weights are gathered."""
    heads = accelerator.unwrap_model(model).heads
    if not weights_sharded(accelerator):
        return heads if accelerator.is_main_process else None
    if zero_stage(accelerator) == 3:
        state = _gathered_state(heads, keep=accelerator.is_main_process)
    else:  # FSDP
        state = {k.removeprefix("heads."): v for k, v in accelerator.get_state_dict(model).items()}
    if not accelerator.is_main_process:
        return None
    with torch.random.fork_rng(devices=[]):  # a fresh module's init must not move the run's RNG
        whole = type(heads)(heads.config)
    whole.load_state_dict(state)
    return whole


def _gathered_state(module: nn.Module, keep: bool) -> dict[str, torch.Tensor] | None:
    """`module`'s whole state under ZeRO-3, gathered from every process (a collective) and kept on
    this one if `keep`. Only the module's own parameters are gathered, never the rest of the model:
    a Medusa-2 objective also holds the target, which must not land whole on one process."""
    import deepspeed  # lazy: deepspeed is slow to import and only used under ZeRO

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if keep else None


def _save_state_options(accelerator) -> dict:
    """accelerator.save_state options: a DeepSpeed engine writes no copy of frozen weights (the
    Medusa-2 target's base; the heads' objective has none otherwise)."""
    from accelerate.utils import DistributedType  # lazy: accelerate is only needed once a run starts

    return (
        {"exclude_frozen_parameters": True}
        if accelerator.distributed_type == DistributedType.DEEPSPEED
        else {}
    )


def register_state_hooks(accelerator) -> None:
    """Keep accelerate from writing (and reading) a second copy of whole heads: the checkpoint's own
    model.safetensors holds them. Sharded heads (DeepSpeed, FSDP) stay in accelerate's layout."""
    accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: weights.clear())
    accelerator.register_load_state_pre_hook(lambda models, input_dir: models.clear())


def save_checkpoint(
    accelerator,
    model,
    output_dir: str | Path,
    state: dict,
    record: TargetRecord,
    training: dict,
    label_counts: torch.Tensor | None = None,
) -> Path:
    """Write checkpoints/step-{state['step']} atomically (the heads with the rows' `label_counts`); every
    process must call it."""
    root = Path(output_dir) / CHECKPOINTS
    final, tmp = root / f"step-{state['step']}", root / f".tmp-step-{state['step']}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with naming_a_full_disk(tmp / ACCELERATE_STATE):
        accelerator.save_state(str(tmp / ACCELERATE_STATE), **_save_state_options(accelerator))
    heads = heads_for_saving(accelerator, model)
    accelerator.wait_for_everyone()  # every process's files are whole before the main one hashes them
    if accelerator.is_main_process:
        save_heads(heads, tmp, record, training, label_counts=label_counts)
        with naming_a_full_disk(tmp / STATE_FILE):
            state = {**state, "files": checkpoint_files(tmp)}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, model, path: Path) -> dict:
    """Restore a checkpoint into the prepared model, optimizer, schedule and RNGs; returns its trainer state."""
    state = read_state(path)
    verify_checkpoint(path, state, accelerator.process_index)
    try:
        accelerator.load_state(str(path / ACCELERATE_STATE))
    except Exception as e:  # noqa: BLE001 - one that the files' hashes did not catch (an older checkpoint)
        raise ValueError(
            f"{path / ACCELERATE_STATE}: cannot restore the optimizer and schedule ({_brief(e)}); {_ANOTHER}"
        ) from None
    if not _engine_owns_weights(accelerator):
        heads = accelerator.unwrap_model(model).heads
        heads.load_state_dict(load_file(str(path / WEIGHTS_FILE)))  # copied onto the weights' device
    return state


def _engine_owns_weights(accelerator) -> bool:
    from accelerate.utils import DistributedType  # lazy: accelerate is only needed once a run starts

    return accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)


def prune_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` whole checkpoints (keep = 0: keep all)."""
    if keep > 0:
        for _, path in checkpoint_steps(output_dir)[:-keep]:
            shutil.rmtree(path)


# -- stopping on SIGTERM and SIGINT -----------------------------------------------------------------


class StopOnSignal:
    """Within `with`, SIGTERM and SIGINT only set `requested` (and `signal_name`, the first one's); the loop
    saves and stops at the end of its step. A second SIGINT raises KeyboardInterrupt at once: Ctrl-C twice
    quits without waiting for the step and its save.

    Only the main thread can take signals; elsewhere this does nothing.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS):
        self.signals, self.requested, self._previous = signals, False, {}
        self.signal_name: str | None = None

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        if not self.requested:
            self.signal_name = signal.Signals(signum).name
        self.requested = True
        if signum == signal.SIGINT:  # os.write: a print here could land inside another write to stderr
            os.write(
                2, b"\nCtrl-C: stopping after this step to save a checkpoint (Ctrl-C again quits at once)\n"
            )

    def exit_code(self) -> int:
        """What a shell reports for a process the first signal ended (128 + its number)."""
        return 128 + signal.Signals[self.signal_name] if self.signal_name else INTERRUPTED_EXIT_CODE

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
