"""Processes, and where the frozen target lives: accelerate set-up for DDP and DeepSpeed ZeRO-2/3.

`accelerate launch --config_file recipes/accelerate/<x>.yaml -m specheads.train RECIPE.yaml` picks the
layout (each file's header has its command):

    ddp.yaml                    heads: DDP            target: a full copy on every process
    zero2.yaml                  heads: ZeRO-2         target: a full copy on every process
    zero3-sharded-target.yaml   heads: ZeRO-3         target: ZeRO-3, each process holds 1/N of its weights

A ZeRO-3 target is loaded partitioned (transformers loads under deepspeed.zero.Init while accelerate's
DeepSpeed plugin is active) and wrapped in its own DeepSpeed engine without an optimizer (the pattern TRL
uses for frozen reference models); the engine's hooks gather each layer's weights for its forward and
free them after. The heads' loss borrows the target's embedding and lm_head through the same hooks.

Machines without an accelerator run the same configs as CPU processes over gloo.
"""

from __future__ import annotations

import copy
import logging
import os
import resource
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

from specheads.train.config import TrainConfig
from specheads.train.tracking import accelerator_kwargs


def _no_accelerator_device() -> bool:
    if hasattr(torch, "accelerator"):
        return not torch.accelerator.is_available()
    return not torch.cuda.is_available()


def make_accelerator(cfg: TrainConfig):
    """The Accelerator for a run; CPU-only multi-process launches get gloo (DDP or DeepSpeed)."""
    from accelerate import Accelerator  # lazy: accelerate is only needed once a run starts
    from accelerate.utils import InitProcessGroupKwargs  # lazy: accelerate is only needed once a run starts

    kwargs = dict(
        mixed_precision=cfg.mixed_precision,
        gradient_accumulation_steps=cfg.grad_accum,
        # The schedule counts optimizer steps; accelerate would otherwise step it once per process.
        step_scheduler_with_optimizer=False,
        **accelerator_kwargs(cfg.output_dir, cfg.report_to),  # the trackers; a missing package stops here
    )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and _no_accelerator_device():
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            # accelerate finds no backend for DeepSpeed on CPU by itself (it then counts one process).
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
            _skip_shared_memory_allreduce()
        else:
            kwargs["cpu"] = True  # MULTI_CPU: DDP over gloo
    return Accelerator(**kwargs)


def _skip_shared_memory_allreduce() -> None:
    """DeepSpeed's CPU communication backend JIT-compiles a shared-memory all-reduce when it starts
    (minutes, once per machine). Only tensor-parallel inference uses it; ZeRO does not."""
    import deepspeed.ops  # lazy: deepspeed is slow to import and only used under ZeRO

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_config(accelerator) -> dict | None:
    """The active DeepSpeed config (a dict accelerate hands to deepspeed.initialize), or None."""
    plugin = accelerator.state.deepspeed_plugin
    return None if plugin is None else plugin.deepspeed_config


def zero_stage(accelerator) -> int:
    """0 without DeepSpeed, else the ZeRO stage of its config."""
    config = deepspeed_config(accelerator)
    return 0 if config is None else int(config.get("zero_optimization", {}).get("stage", 0))


def fill_deepspeed_config(accelerator, cfg: TrainConfig) -> None:
    """Fill the DeepSpeed config's "auto" batch, accumulation and clipping values from the recipe.

    accelerate would read the micro-batch size off a prepared DataLoader; the loop shards its own data,
    so the recipe says it. A value given in the file must agree with the recipe.
    """
    config = deepspeed_config(accelerator)
    if config is None:
        return
    wanted = {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "gradient_clipping": cfg.max_grad_norm,
        "train_batch_size": cfg.batch_size * cfg.grad_accum * accelerator.num_processes,
    }
    problems = []
    for key, value in wanted.items():
        given = config.get(key, "auto")
        if given == "auto":
            config[key] = value
        elif float(given) != float(value):
            problems.append(f"{key}: DeepSpeed config has {given!r}, the recipe makes it {value!r}")
    if problems:
        raise ValueError(
            'the DeepSpeed config disagrees with the recipe (set these to "auto" to take the recipe\'s):\n  '
            + "\n  ".join(problems)
        )


def check_optimizer_layout(accelerator, optimizer: str) -> None:
    """Refuse Muon where the heads' matrices reach the optimizer split over processes: DeepSpeed's ZeRO
    hands it flat partitions of the weights, FSDP shards them, and Muon orthogonalises each matrix whole."""
    from accelerate.utils import DistributedType  # lazy: accelerate is only needed once a run starts

    split = {DistributedType.DEEPSPEED: "DeepSpeed", DistributedType.FSDP: "FSDP"}
    if optimizer == "muon" and accelerator.distributed_type in split:
        raise ValueError(
            f"optimizer 'muon' cannot run under {split[accelerator.distributed_type]}, which splits the heads' "
            "matrices over processes: launch with recipes/accelerate/ddp.yaml (or one process), or set "
            "optimizer=adamw"
        )


def is_partitioned(module: torch.nn.Module) -> bool:
    """Whether ZeRO-3 has partitioned the module's weights (each process holds a slice)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def gathered_output_weights(target):
    """A context in which the target's lm_head weight and final norm are whole, also under ZeRO-3: set-up
    reads the lm_head's shape and copies it into Medusa heads, and an EAGLE-3 head started from the target
    (draft_head_init: target) copies its rows and the norm."""
    if not is_partitioned(target.model):
        return nullcontext()
    import deepspeed  # lazy: deepspeed is slow to import and only used under ZeRO

    weights = [target.lm_head.weight, *target.norm.parameters()]
    return deepspeed.zero.GatheredParameters(weights, modifier_rank=None)


def shard_target(accelerator, target):
    """Under ZeRO-3, wrap the (partitioned) frozen target in an optimizer-less DeepSpeed engine whose
    hooks gather each module's weights when it runs; otherwise leave it whole. Returns the engine (keep
    it alive) or None."""
    if zero_stage(accelerator) != 3:
        return None
    import deepspeed  # lazy: deepspeed is slow to import and only used under ZeRO

    config = copy.deepcopy(deepspeed_config(accelerator))
    for key in ("optimizer", "scheduler"):
        config.pop(key, None)
    engine, *_ = deepspeed.initialize(model=target.model, config=config)
    target.freeze()
    return engine


def target_parameter_counts(target) -> tuple[int, int]:
    """(parameters of the target, elements of them held by this process)."""
    total = resident = 0
    for p in target.model.parameters():
        total += int(getattr(p, "ds_numel", p.numel()))
        # a partitioned weight's own tensor is empty outside its module's forward; its slice is ds_tensor
        resident += p.numel() + (p.ds_tensor.numel() if hasattr(p, "ds_tensor") else 0)
    return total, resident


def memory_per_process(accelerator) -> dict[str, list]:
    """Each process's peak resident memory (loading included), its resident memory now, and its
    accelerator's peak allocation (-1 without one), in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    try:
        now = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    except OSError:  # not Linux
        now = -1
    device = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else -1
    mine = torch.tensor([peak, now, device], dtype=torch.int64, device=accelerator.device)
    every = accelerator.gather(mine[None]).cpu()  # (processes, 3)
    names = ("peak_rss_bytes", "rss_bytes_at_end", "peak_accelerator_bytes")
    return {name: every[:, i].tolist() for i, name in enumerate(names)}


def end_launched_process(code: int) -> None:
    """End a process of a multi-process launch (`WORLD_SIZE` > 1) here, without interpreter finalization.

    Call it once every file is written and the process group is destroyed (`finish` does both). On CPU
    (gloo) a process that went through finalization sometimes aborted there ("terminate called without an
    active exception", SIGABRT) after a run that had finished and written everything: gloo's worker
    threads still held work objects whose destruction needs the interpreter (pytorch/pytorch#179291).
    It is rare (a few 2-process ZeRO-3 runs, CI among them; none in 13 back-to-back runs of that launch
    made to reproduce it). Skipping finalization removes that window. A single process returns normally.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
