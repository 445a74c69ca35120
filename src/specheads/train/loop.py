"""`specheads train RECIPE.yaml [key=value ...]`: fit draft heads on a frozen target, with accelerate.

    specheads train recipes/tiny/medusa.yaml max_steps=200
    accelerate launch --config_file recipes/accelerate/ddp.yaml -m specheads.train recipes/tiny/medusa.yaml

One optimizer step: `grad_accum` micro-batches, each a frozen-target forward (no gradients) that captures
the layers the heads read, then the heads' loss (by `method`) inside `HeadsWithLoss`, the module DDP /
DeepSpeed wrap, and backward; gradients are clipped, the optimizer steps (train/optimizers.py), the
schedule advances. Each process takes its slice of every global batch (train/sampler.py); the target is a
full copy on each process, or sharded by DeepSpeed ZeRO-3 (train/distributed.py, recipes/accelerate/).
The run's parts (the target, the heads, the rows and their batches, the lr schedule) are built in
train/prepare.py.

`mode: offline` reads the target's hidden states from `cache_dir` (written by `specheads cache`,
train/hidden_cache.py) in place of its forward, and loads only its embedding, final norm and lm_head
(train/offline_target.py). `method: medusa2` trains LoRA adapters on the target with the heads
(train/medusa2.py): the adapted target runs inside `Medusa2WithLoss`, the heads' weight λ0 follows its
warm-up, and the adapter is written beside the heads (`adapter/`, also in every step checkpoint).

Writes to `output_dir`: the final heads (config.json + model.safetensors, so the folder itself is a head
checkpoint; Medusa-2: and adapter/), `checkpoints/step-N/` every `save_every` steps and on SIGTERM or
Ctrl-C (whole, resumed exactly with `resume=auto`: train/checkpointing.py), `metrics.jsonl` (one JSON object
a log or eval), `provenance.jsonl` (one line a launch), `train_summary.json`, and the trackers' runs
(wandb's under wandb/, tensorboard's under logs/, ...: train/tracking.py).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from specheads.builders.named_targets import resolve_target
from specheads.core.atomic import write_json
from specheads.core.target import FrozenTarget, TargetRecord
from specheads.heads import save_heads
from specheads.heads.method import Method
from specheads.train.checkpointing import (
    INTERRUPTED_EXIT_CODE,
    StopOnSignal,
    check_resumable,
    claim_output_dir,
    heads_for_saving,
    load_checkpoint,
    prune_checkpoints,
    read_state,
    register_state_hooks,
    resolve_resume,
    save_checkpoint,
)
from specheads.train.config import TrainConfig
from specheads.train.distributed import (
    check_optimizer_layout,
    fill_deepspeed_config,
    gathered_output_weights,
    make_accelerator,
    memory_per_process,
    shard_target,
    target_parameter_counts,
)
from specheads.train.held_out import HeldOutStates
from specheads.train.host_memory import keep_freed_memory
from specheads.train.memory import check_memory
from specheads.train.objective import HeadsWithLoss
from specheads.train.offline_target import OfflineTarget, target_output
from specheads.train.optimizers import build_optimizer, newton_schulz_dtype
from specheads.train.prepare import (
    build_heads,
    label_counts_of,
    load_target,
    lr_lambda,
    make_data,
    train_batches,
)
from specheads.train.provenance import provenance, write_provenance
from specheads.train.tracking import keep_metrics_until, log_record, new_run_id, start_tracking

# -- one step -------------------------------------------------------------------------------------


class TargetClock:
    """The seconds the frozen target's forwards take. On the CPU the host's clock brackets each forward. On
    a GPU the host only queues the work, so its clock would measure the launches: two CUDA events on the
    stream bracket each forward instead, read by `seconds()` at each log (which has waited for the device
    already) and at the end; reading them at every step would stall the queue (decode/step.py's `timed`
    waits for the device around its work, which decoding can afford and a training step cannot). `event`
    makes the events (a test's stand-in)."""

    def __init__(self, device: torch.device | str, event=None):
        self.gpu = torch.device(device).type == "cuda"
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.total, self.pairs = 0.0, []  # seconds folded in; event pairs not yet read

    def time(self, forward):
        """forward() with its time added; returns what it returns."""
        if not self.gpu:
            started = time.perf_counter()
            out = forward()
            self.total += time.perf_counter() - started
            return out
        start, end = self.event(), self.event()
        start.record()
        out = forward()
        end.record()
        self.pairs.append((start, end))
        return out

    def seconds(self) -> float:
        if self.pairs:
            self.pairs[-1][1].synchronize()  # the last end event: every pair before it has completed
            self.total += sum(start.elapsed_time(end) for start, end in self.pairs) / 1000  # ms -> s
            self.pairs.clear()
        return self.total


def heads_loss(
    method: Method, model, target, batch: dict, weight: float = 0.0, clock=None, forward=target_output
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target's forward over `batch`, then the heads' loss through `model`.

    This is the loop's one call into the target: online it runs, offline (OfflineTarget) it reads the
    cached states the batch carries. `model` is the prepared HeadsWithLoss: calling it, not its insides,
    is what lets DDP and DeepSpeed do their part. A method whose objective `runs_target` (Medusa-2's
    adapted target) is called with `weight`, the heads' loss weight. `clock` (a TargetClock) times the
    target's forward; `forward` gives it (target_output, or held-out states kept: HeldOutStates).
    Returns (loss, metric sums).
    """
    if method.runs_target:
        return model(batch, weight)
    objective = getattr(model, "module", model)  # the HeadsWithLoss inside a DDP / DeepSpeed wrapper
    run_target = partial(
        forward, target, batch, capture=objective.capture_layers, logits=objective.needs_logits
    )
    out = run_target() if clock is None else clock.time(run_target)
    return model(batch, out, target)


def metric_sums(cfg: TrainConfig, method: Method, device=None) -> torch.Tensor:
    """Zeroed sums of the method's metrics: (rows, heads or draft steps), float64 on `device` (the
    accelerator's, where the losses leave their sums; the host for a device without float64)."""
    device = torch.device(device or "cpu")
    device = device if device.type in ("cpu", "cuda") else torch.device("cpu")
    return torch.zeros(*method.metric_shape(cfg), dtype=torch.float64, device=device)


def summarise(cfg: TrainConfig, method: Method, sums: torch.Tensor) -> dict[str, float]:
    """Summed metrics -> means, tau_sim and the loss as training weighs it."""
    return method.summarise(cfg, sums)


def train_step(
    cfg: TrainConfig, accelerator, run: Run, batches, window: torch.Tensor, timing: dict, step: int
) -> float:
    """Optimizer step `step` over `grad_accum` micro-batches; adds their metrics to `window`. Returns the
    gradient norm before clipping."""
    weight = run.method.heads_weight(cfg, step)
    for _ in range(cfg.grad_accum):
        batch = next(batches)
        with accelerator.accumulate(run.model):  # gradients sync on the last micro-batch only
            with accelerator.autocast():
                loss, metrics = heads_loss(run.method, run.model, run.target, batch, weight, timing["target"])
            accelerator.backward(loss)  # divided by grad_accum
        # Sums stay on the device until a log reads them: a read on the host makes a GPU wait for all
        # the work queued before it (tests/train/test_loop_syncs.py counts them).
        window += metrics.to(window.device)
        timing["labels"] = timing["labels"] + batch["loss_mask"].sum()
    grad_norm = accelerator.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm)
    run.optimizer.step()  # under DeepSpeed these three are its engine's, done in backward()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return float("nan") if grad_norm is None else grad_norm


@torch.no_grad()
def evaluate(
    cfg: TrainConfig,
    method: Method,
    accelerator,
    model,
    target,
    loader: DataLoader,
    states: HeldOutStates | None = None,
) -> dict[str, float]:
    """Held-out metrics over the first `eval_batches` global batches (batch_size rows per process):
    loader batch i runs on process i mod N, so the rows, and the sums, do not depend on N. `states`: the
    target's states over them kept from an earlier evaluation (train/held_out.py), else it runs each time.

    Every process runs the same number of forwards (a ZeRO-3 target gathers its weights from all of
    them), so one that runs out of batches repeats its last and leaves it out of the sums.
    """
    model.eval()
    procs = accelerator.num_processes
    batches = list(itertools.islice(loader, cfg.eval_batches * procs))
    n = len(batches)
    sums = metric_sums(cfg, method, accelerator.device)
    for i in range(accelerator.process_index, math.ceil(n / procs) * procs, procs):
        batch = {k: v.to(accelerator.device) for k, v in batches[min(i, n - 1)].items()}
        # metrics do not depend on the heads' weight
        forward = target_output if states is None else partial(states.target_output, index=min(i, n - 1))
        weight = getattr(
            cfg.settings, "lambda0", 0.0
        )  # the peak heads' weight of an objective that takes one
        _, metrics = heads_loss(method, model, target, batch, weight, forward=forward)
        if i < n:
            sums += metrics.to(sums.device)
    model.train()
    return summarise(cfg, method, accelerator.reduce(sums.to(accelerator.device), reduction="sum").cpu())


def train_record(
    cfg: TrainConfig, accelerator, run: Run, step: int, window, grad_norm: float, timing: dict, since: tuple
) -> dict:
    """The train log record of the steps since the last one (whose timing and label count are `since`);
    empties the metric window."""
    summary = summarise(cfg, run.method, accelerator.reduce(window.to(accelerator.device), "sum").cpu())
    window.zero_()
    timing["target"].seconds()  # folds the events of the steps logged (the read above waited for them)
    seconds, labels = timing["step"] - since[0], float(timing["labels"] - since[1])
    lrs = run.scheduler.get_last_lr()  # Medusa-2: (heads, adapters)
    extra = run.method.log_extras(cfg, step, lrs)
    return {
        "step": step,
        "split": "train",
        "lr": lrs[0],
        **extra,
        "grad_norm": float(grad_norm),
        **summary,
        "labels_per_second": accelerator.num_processes * labels / max(seconds, 1e-9),  # all processes
    }


def stop_requested(accelerator, stop: StopOnSignal) -> bool:
    """Whether any process got SIGTERM or SIGINT: then all of them save and stop after the same step. (One process
    reads its own flag: the reduce's read on the host would make a GPU wait every step.)"""
    if accelerator.num_processes == 1:
        return stop.requested
    flag = torch.tensor([float(stop.requested)], device=accelerator.device)
    return accelerator.reduce(flag, reduction="sum").item() > 0


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Run:
    """What a training run holds from set-up to the end."""

    method: Method  # its entry in the method table
    target: FrozenTarget | OfflineTarget  # Medusa-2: the target with its LoRA adapters
    record: TargetRecord
    model: nn.Module  # HeadsWithLoss (Medusa-2: Medusa2WithLoss), as accelerate prepared it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_rows: object  # tokenised rows
    collate: object
    eval_loader: DataLoader | None
    training: dict  # what the heads' checkpoints record of the run
    label_counts: torch.Tensor  # (V,) how often each token is a label in the training rows, saved beside
    target_engine: object = None  # the ZeRO-3 engine that holds the sharded target
    held_out: HeldOutStates | None = None  # the target's states over the held-out batches, once evaluated


def build_objective(
    cfg: TrainConfig, method: Method, target, heads: nn.Module
) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    """(the module data-parallel wrappers train, its optimizer (train/optimizers.py), the target from here on).

    HeadsWithLoss holds the heads only; the frozen target stays outside it. A method with an objective
    of its own builds it (Medusa-2: LoRA adapters on the target, trained with the heads).
    """
    if method.objective is not None:
        return method.objective(cfg, target, heads)
    model = HeadsWithLoss(
        heads,
        method.loss,
        capture_layers=tuple(heads.capture_layers),
        needs_logits=method.needs_logits(cfg),
        topk=cfg.topk,
        settings=cfg.settings,
    )
    optimizer = build_optimizer(
        model, cfg.optimizer, cfg.lr, cfg.adam_betas, cfg.weight_decay, cfg.muon_lr_scale, cfg.muon_dtype
    )
    return model, optimizer, target


def set_up(cfg: TrainConfig, method: Method, accelerator) -> Run:
    check_optimizer_layout(accelerator, cfg.optimizer)  # before the target loads
    with accelerator.main_process_first():  # builds the embedded target once
        path = resolve_target(cfg.target)
    target = load_target(cfg, path, accelerator.device)
    record = target.record()
    with accelerator.main_process_first():  # tokenises once, into the datasets cache
        train_rows, collate, eval_loader = make_data(
            cfg,
            target.tokenizer,
            record,
            verify=accelerator.is_local_main_process,  # checksums once
            method=method,
        )
    label_counts = label_counts_of(train_rows, target)
    with gathered_output_weights(target):
        heads, notes = build_heads(cfg, method, target, label_counts=label_counts)
    model, optimizer, target = build_objective(cfg, method, target, heads)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_lambda, cfg=cfg))
    fill_deepspeed_config(accelerator, cfg)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    # Offline there are no decoder layers to shard; an objective that runs the target holds it.
    engine = shard_target(accelerator, target) if cfg.mode == "online" and not method.runs_target else None
    register_state_hooks(accelerator)
    notes.update(method.after_prepare(accelerator, target))
    training = {**cfg.to_dict(), "target_resolved": target.name_or_path, **notes}
    # offline the batches carry their states; a ZeRO-3 target's lm_head is a shard outside its forward
    keeps = cfg.mode == "online" and not method.runs_target and engine is None and eval_loader is not None
    columns = method.logit_columns and partial(method.logit_columns, heads)  # all its loss reads but argmax
    return Run(
        method,
        target,
        record,
        model,
        optimizer,
        scheduler,
        train_rows,
        collate,
        eval_loader,
        training,
        label_counts,
        engine,
        HeldOutStates(cfg.eval_cache_mib, columns) if keeps else None,
    )


def train(
    cfg: TrainConfig, method: Method, progress: bool = True, overwrite: bool = False, force: bool = False
) -> dict:
    """Train heads as `cfg` says; returns the run summary (also written to train_summary.json). `method`:
    `cfg.method`'s entry in the method table (`specheads.methods.method_named(cfg.method)`).
    `overwrite`: delete another run's results in output_dir first (refused otherwise, unless resumed).
    The run's memory is estimated and printed first (train/memory.py); one that cannot fit its device is
    refused (MemoryEstimateError) unless `force`."""
    if method.name != cfg.method:
        raise ValueError(f"the recipe trains method {cfg.method!r}, but the entry given is {method.name!r}")
    accelerator = make_accelerator(cfg)
    with accelerator.main_process_first():  # builds the embedded target once
        path = resolve_target(cfg.target)
    check_memory(cfg, method, path, accelerator, force=force)  # from its config: before any weight or row
    with claim_output_dir(cfg, accelerator.is_main_process, overwrite):  # before any expensive work
        # SIGTERM and SIGINT are taken from here on, set-up included (loading the target can take minutes):
        # they only ask the loop to save and stop after its next step, so a run stopped at any point exits
        # 143 (130) with a checkpoint, never killed half-way with metrics.jsonl already started
        with StopOnSignal() as stop, keep_freed_memory(cfg.keep_host_memory):
            return run_training(cfg, method, accelerator, progress, stop)


def run_training(cfg: TrainConfig, method: Method, accelerator, progress: bool, stop: StopOnSignal) -> dict:
    from accelerate.utils import set_seed  # lazy: accelerate is only needed once a run starts

    set_seed(cfg.seed)
    out_dir, main = Path(cfg.output_dir), accelerator.is_main_process
    resume_from = resolve_resume(cfg, announce=main)
    run = set_up(cfg, method, accelerator)
    state = {"step": 0, "global_batches": 0, "window": None, "run_id": new_run_id()}
    if resume_from is not None:
        state = read_state(resume_from)
        check_resumable(state, cfg, accelerator.num_processes, run.record, resume_from, method=method)
        load_checkpoint(accelerator, run.model, resume_from)
    state.update(num_processes=accelerator.num_processes, config=cfg.to_dict())
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        keep_metrics_until(out_dir / "metrics.jsonl", state["step"])
        launch = provenance(
            cfg.to_dict(),
            accelerator.num_processes,
            resume_from and str(resume_from),
            chat_template=run.target.tokenizer.chat_template,
        )
        write_provenance(out_dir, launch)
    start_tracking(accelerator, cfg, state["run_id"], state["step"])
    log = partial(log_record, accelerator, out_dir / "metrics.jsonl")

    batches = train_batches(cfg, run.train_rows, run.collate, accelerator, start=state["global_batches"])
    # Metric sums since the last train log (a checkpoint keeps all processes' on the main one).
    window = metric_sums(cfg, method, accelerator.device)
    if state["window"] is not None and main:
        window += torch.tensor(state["window"], dtype=torch.float64).to(window.device)
    timing = {
        "target": TargetClock(accelerator.device),
        "step": 0.0,
        "labels": 0,
        "eval": 0.0,
        "started": time.perf_counter(),
    }
    first = step = state["step"]
    steps = range(first + 1, cfg.max_steps + 1)
    bar = tqdm(
        steps, "train", cfg.max_steps, initial=first, disable=not (progress and main), dynamic_ncols=True
    )
    last_eval, since = {}, (0.0, 0)  # (step seconds, labels) at the last train log
    run.model.train()
    for step in bar:
        started = time.perf_counter()
        grad_norm = train_step(cfg, accelerator, run, batches, window, timing, step)
        timing["step"] += time.perf_counter() - started
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            record = train_record(cfg, accelerator, run, step, window, grad_norm, timing, since)
            since = (timing["step"], timing["labels"])
            log(record)
            top1 = "/".join(f"{v:.2f}" for k, v in record.items() if k.endswith("/top1"))
            bar.set_postfix(loss=f"{record['loss']:.3f}", top1=top1, tau_sim=f"{record['tau_sim']:.2f}")
        if run.eval_loader is not None and (step % cfg.eval_every == 0 or step == cfg.max_steps):
            started = time.perf_counter()
            last_eval = evaluate(
                cfg, method, accelerator, run.model, run.target, run.eval_loader, run.held_out
            )
            timing["eval"] += time.perf_counter() - started
            log({"step": step, "split": "eval", **last_eval})
        stopping = stop_requested(accelerator, stop)
        if stopping or (cfg.save_every and step % cfg.save_every == 0 and step != cfg.max_steps):
            everyone = accelerator.reduce(window.to(accelerator.device).clone(), "sum").cpu()
            state.update(step=step, global_batches=step * cfg.grad_accum, window=everyone.tolist())
            save_checkpoint(
                accelerator,
                run.model,
                out_dir,
                state,
                run.record,
                {**run.training, "step": step},
                label_counts=run.label_counts,
            )
            if main:
                prune_checkpoints(out_dir, cfg.keep_checkpoints)
        if stopping:
            break
    bar.close()
    return finish(cfg, accelerator, run, step - first, step, timing, last_eval, resume_from, stop)


def finish(
    cfg: TrainConfig,
    accelerator,
    run: Run,
    steps_run: int,
    step: int,
    timing: dict,
    last_eval: dict,
    resume_from,
    stop: StopOnSignal | None = None,
) -> dict:
    """Write the final heads (a whole run) and train_summary.json; returns the summary."""
    accelerator.wait_for_everyone()
    out_dir, completed, steps_run = Path(cfg.output_dir), step >= cfg.max_steps, max(steps_run, 1)
    # ZeRO-3 keeps a gathered weight that the step uses again (the lm_head the loss borrows) until the
    # step's backward; after the last eval, let go of it so the count below is the resting one. (Medusa-2's
    # target is inside the heads' engine.)
    for engine in (run.target_engine, run.model):
        if hasattr(engine, "empty_partition_cache"):
            engine.empty_partition_cache()
    total, resident = target_parameter_counts(run.target)
    resident_all = accelerator.gather(torch.tensor([resident], device=accelerator.device)).tolist()
    memory = memory_per_process(accelerator)
    inside = run.method.runs_target  # its target runs inside the objective's forward: not timed apart
    target_seconds = timing["target"].seconds()
    muon_dtype = newton_schulz_dtype(accelerator.device, cfg.muon_dtype) if cfg.optimizer == "muon" else None
    summary = {
        "steps": cfg.max_steps,
        "completed": completed,  # False: stopped by SIGTERM or SIGINT after `last_step`; resume=auto continues
        "last_step": step,
        # which signal stopped an unfinished run (a process it did not reach stopped with the others: SIGTERM),
        # and the exit code `specheads train` gives it (128 + the signal's number)
        "stopped_by": None if completed else (stop and stop.signal_name) or "SIGTERM",
        "exit_code": 0 if completed else stop.exit_code() if stop else INTERRUPTED_EXIT_CODE,
        "resumed_from": resume_from and str(resume_from),
        "wall_seconds": round(time.perf_counter() - timing["started"], 2),
        "step_seconds": timing["step"] / steps_run,
        "eval_seconds": round(timing["eval"], 2),  # all held-out evaluations of this launch
        "target_forward_seconds": None if inside else target_seconds / steps_run,
        "step_to_target_forward_ratio": None if inside else timing["step"] / max(target_seconds, 1e-9),
        "labels_per_second": accelerator.num_processes * float(timing["labels"]) / max(timing["step"], 1e-9),
        "processes": accelerator.num_processes,
        # what muon_dtype "auto" chose on this machine (None: no Muon)
        "muon_newton_schulz_dtype": muon_dtype and str(muon_dtype).removeprefix("torch."),
        "target_parameters": total,
        "target_resident_parameters": resident_all,  # per process: about total / N under ZeRO-3
        **memory,  # per process
        "eval": last_eval,
    }
    heads = heads_for_saving(accelerator, run.model) if completed else None
    if completed and run.method.save_extra is not None:  # before the heads: config.json is written last
        run.method.save_extra(accelerator, run.target, out_dir)
    if accelerator.is_main_process:
        if completed:
            training = {**run.training, "step": cfg.max_steps, "eval": last_eval}
            save_heads(heads, out_dir, run.record, training, label_counts=run.label_counts)
        write_json(out_dir / "train_summary.json", summary)
    # Every process tears its process group down together, once the files are written: a second process
    # that left while the main one still wrote could abort at exit ("terminate called without an active
    # exception"; 2-process ZeRO-3 launches on CPU, gloo).
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary
