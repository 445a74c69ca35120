"""The training recipe: the keys every method reads (`TrainConfig`), then the method's own section.

A recipe names its method, sets the common keys at the top level, and the method's keys in a section
named after it (the dataclass its module owns, `Method.settings_class`; `cfg.settings` holds it):

    method: eagle3
    lr: 3.0e-4
    eagle3: {draft_vocab_size: 8192, ttt_steps: 7}

Reading one (a YAML file, command-line overrides, a checkpoint's training record) into a checked
`TrainConfig` is train/recipe.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from specheads.data.readers import check_max_bad_rows
from specheads.heads.method import Method
from specheads.train.optimizers import MUON_DTYPES, OPTIMIZERS, muon_missing
from specheads.train.tracking import report_to_problem

MIXED_PRECISION = ("no", "bf16", "fp16")
LR_SCHEDULES = ("cosine", "linear")
MODES = ("online", "offline")


class RecipeKeyMoved(FutureWarning):
    """A recipe or override sets a method's key at the top level: it loads, and the message names the key's
    place in the method's section."""


def recipe_key(default: Any = MISSING, help: str = "", *, factory=None, old: str = "") -> Any:
    """A recipe key: its default (or `factory` for a list), a one-line `help` (docs/recipes.md), and for a
    method's key, `old`: its top-level name before the sections, where that differs from its own."""
    metadata = {"help": help, **({"old": old} if old else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class NoSettings:
    """The section of a method that reads no keys of its own."""


def settings_class(method: Method) -> type:
    """The dataclass of `method`'s recipe section."""
    return method.settings_class or NoSettings


@dataclass
class TrainConfig:
    # what to train
    method: str = recipe_key("medusa", "the method trained: medusa, medusa2, eagle or eagle3")
    target: str = recipe_key(
        "tiny", 'a local HF directory, a hub name, or "tiny" (the embedded default, built if needed)'
    )
    target_dtype: str = recipe_key("float32", "the dtype the frozen target is loaded in")
    attn_implementation: str = recipe_key(
        "auto", "the target's attention: auto (sdpa, or eager where transformers refuses sdpa), sdpa or eager"
    )
    trust_remote_code: bool = recipe_key(
        False,
        "run the Python code a target's directory or hub repository ships for a custom architecture "
        "(transformers' trust_remote_code; --trust-remote-code); off: such a target is refused",
    )
    mode: str = recipe_key(
        "online", '"online": the target runs every batch; "offline": its states are read from cache_dir'
    )
    cache_dir: str = recipe_key(
        "", "the hidden-state cache (`specheads cache` writes it; offline mode reads it)"
    )
    # data
    data: list[str] = recipe_key(
        factory=lambda: ["stdlib"], help='training sources; "stdlib": the tiny target\'s training files'
    )
    eval_data: list[str] = recipe_key(
        factory=list, help="held-out sources; empty: eval_fraction of data is held out"
    )
    eval_fraction: float = recipe_key(
        0.02, "of the rows held out; of the distinct prompts when a prompt has several answers"
    )
    max_length: int = recipe_key(512, "tokens a training row is cut to")
    packing: bool = recipe_key(False, "pack several rows into one sequence of max_length")
    loss_on: str = recipe_key("assistant", 'for chat rows: "assistant", "last_assistant" or "all" turns')
    chat_template: str = recipe_key(
        "",
        "the chat template conversations are rendered with: a .jinja file or the template's text; "
        '"": the target tokenizer\'s own (a base model has none)',
    )
    enable_thinking: bool | None = recipe_key(
        None,
        "a thinking model's switch, passed to its chat template (Qwen3: false renders an empty <think> "
        "block); null: the template's default",
    )
    reasoning: str = recipe_key(
        "keep",
        '"keep": an assistant turn\'s reasoning (reasoning_content, or a <think> block opening its content) '
        'reaches the template, which decides what to render; "drop": answers only',
    )
    max_bad_rows: int | float = recipe_key(
        0.01, "rows that cannot be read or masked: a count, or a fraction; more stops the run"
    )
    include_capped: bool = recipe_key(
        False, "train on distilled rows whose answer was cut off at max_new_tokens too"
    )
    min_label_tokens: int = recipe_key(16, "fewer label tokens than this in all training rows stops the run")
    min_label_tokens_per_row: float = recipe_key(
        3.0, "fewer label tokens a row on average stops the run (an empty assistant turn leaves one or two)"
    )
    # optimisation
    batch_size: int = recipe_key(8, "rows per process, per micro-step")
    grad_accum: int = recipe_key(1, "micro-steps an optimizer step")
    lr: float = recipe_key(1e-3, "the heads' peak learning rate")
    weight_decay: float = recipe_key(0.0, "AdamW's weight decay")
    adam_beta2: float = recipe_key(
        0.999, "AdamW's beta2: PyTorch's and the HF Trainer's 0.999; EAGLE's trainer uses 0.95"
    )
    optimizer: str = recipe_key(
        "adamw",
        '"adamw", or "muon": Muon on the heads\' hidden matrices, AdamW on the rest (not with DeepSpeed, '
        "FSDP or medusa2)",
    )
    muon_lr_scale: float = recipe_key(
        8.0, "Muon's learning rate is this times lr (its updates are scaled to AdamW's RMS)"
    )
    muon_dtype: str = recipe_key(
        "auto",
        'the dtype of Muon\'s Newton-Schulz products: "auto" (bf16 where bf16 products are fast, else fp32), '
        '"float32" or "bfloat16"',
    )
    warmup_steps: int = recipe_key(50, "optimizer steps of linear warm-up")
    warmup_ratio: float = recipe_key(
        0.0, "the warm-up as a fraction of max_steps instead (ceil(ratio * max_steps)); set warmup_steps: 0"
    )
    lr_schedule: str = recipe_key(
        "cosine", 'after the warm-up: "cosine" to a tenth of lr at max_steps, or "linear" to 0'
    )
    max_steps: int = recipe_key(1000, "optimizer steps")
    max_grad_norm: float = recipe_key(1.0, "gradients are clipped to this norm")
    mixed_precision: str = recipe_key("no", 'accelerate\'s mixed precision: "no", "bf16" or "fp16"')
    seed: int = recipe_key(0, "draws the heads' initial weights, and orders the rows unless data_seed does")
    data_seed: int = recipe_key(-1, "orders the training rows (each epoch's shuffle); -1: seed's")
    # evaluation, logging, checkpoints
    topk: int = recipe_key(5, "the k of the top-k accuracy logged")
    eval_every: int = recipe_key(200, "optimizer steps between held-out evaluations")
    eval_batches: int = recipe_key(20, "held-out batches an evaluation reads")
    eval_cache_mib: int = recipe_key(
        1024, "online: MiB of the target's held-out states kept in host memory after the first evaluation"
    )
    save_every: int = recipe_key(0, "optimizer steps between checkpoints; 0: only at the end")
    keep_checkpoints: int = recipe_key(0, "keep the newest N checkpoints/step-K; 0 keeps all")
    allow_target_mismatch: bool = recipe_key(
        False, "resume onto a target whose weights fingerprint differs (--allow-target-mismatch)"
    )
    resume: str = recipe_key(
        "", '"": start afresh; "auto": the latest whole checkpoint in output_dir, if any; or a path'
    )
    log_every: int = recipe_key(10, "optimizer steps between log lines")
    output_dir: str = recipe_key("runs/medusa", "where the heads, checkpoints and logs are written")
    num_workers: int = recipe_key(0, "DataLoader worker processes")
    keep_host_memory: bool = recipe_key(
        True, "keep the memory torch frees on a CPU run, so that a step does not fault its pages in again"
    )
    # tracking
    report_to: list[str] = recipe_key(
        help="accelerate's trackers: wandb (offline without WANDB_API_KEY), tensorboard, ..., several as a list "
        '("tensorboard,wandb" on the command line), "all" installed, or "none"',
        factory=lambda: ["wandb"],
    )
    wandb_project: str = recipe_key("specheads", "the wandb project")
    run_name: str = recipe_key("", "wandb's run name; empty: wandb picks one")
    # the method's own keys: its settings_class, read from the recipe's section named after the method
    settings: Any = field(default=None, metadata={"section": True})

    @property
    def warmup(self) -> int:
        """The warm-up's optimizer steps: warmup_steps, or ceil(warmup_ratio * max_steps) when that is set."""
        return math.ceil(self.warmup_ratio * self.max_steps) if self.warmup_ratio else self.warmup_steps

    def __post_init__(self):
        # the checks that need no method table; `check_method` (which `load_config` runs) does the rest
        checks = [
            (
                self.loss_on in ("assistant", "last_assistant", "all"),
                f"loss_on must be 'assistant', 'last_assistant' or 'all', got {self.loss_on!r}",
            ),
            (self.mixed_precision in MIXED_PRECISION, f"mixed_precision must be one of {MIXED_PRECISION}"),
            (
                self.reasoning in ("keep", "drop"),
                f"reasoning must be 'keep' or 'drop', got {self.reasoning!r}",
            ),
            (
                self.lr_schedule in LR_SCHEDULES,
                f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}",
            ),
            (self.data_seed >= -1, f"data_seed must be >= 0, or -1 for seed's, got {self.data_seed}"),
            (self.mode in MODES, f"mode must be one of {MODES}, got {self.mode!r}"),
            (self.optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}"),
            (self.optimizer != "muon" or not muon_missing(), muon_missing()),
            (
                self.muon_dtype in MUON_DTYPES,
                f"muon_dtype must be one of {MUON_DTYPES}, got {self.muon_dtype!r}",
            ),
            (
                self.mode != "offline" or bool(self.cache_dir),
                "mode 'offline' reads the hidden-state cache: set cache_dir (written by `specheads cache`)",
            ),
            (not (report_to := report_to_problem(self.report_to)), report_to),
            (self.save_every >= 0, f"save_every must be >= 0, got {self.save_every}"),
            (self.keep_checkpoints >= 0, f"keep_checkpoints must be >= 0, got {self.keep_checkpoints}"),
            (0 <= self.eval_fraction < 1, f"eval_fraction must be in [0, 1), got {self.eval_fraction}"),
            (bool(self.data), "data must name at least one source"),
        ]
        for name in (
            "batch_size",
            "grad_accum",
            "max_steps",
            "max_length",
            "topk",
            "eval_every",  # a step count that divides: 0 would never come round
            "eval_batches",
            "log_every",
        ):
            checks.append((getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}"))
        for name in ("lr", "max_grad_norm", "muon_lr_scale"):
            checks.append((getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}"))
        for name in (
            "warmup_steps",
            "weight_decay",
            "eval_cache_mib",
            "num_workers",
            "min_label_tokens",
            "min_label_tokens_per_row",
        ):
            checks.append((getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}"))
        checks.append((0 <= self.adam_beta2 < 1, f"adam_beta2 must be in [0, 1), got {self.adam_beta2}"))
        checks.append(
            (0 <= self.warmup_ratio < 1, f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        )
        checks.append(
            (
                not (self.warmup_ratio and self.warmup_steps),
                f"set warmup_steps or warmup_ratio, not both (got {self.warmup_steps} and {self.warmup_ratio}): "
                "a recipe with warmup_ratio sets warmup_steps to 0, and `warmup_steps=N warmup_ratio=0` overrides it",
            )
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(f"bad recipe value: {message}")
        try:
            check_max_bad_rows(self.max_bad_rows)
        except ValueError as e:
            raise ValueError(f"bad recipe value: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The common keys, then the method's section under its name (what checkpoints record)."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in common_fields()}
        section = dataclasses.asdict(self.settings) if self.settings is not None else {}
        if section:
            out[self.method] = section
        return out

    @property
    def adam_betas(self) -> tuple[float, float]:
        """AdamW's betas for every objective: PyTorch's beta1, the recipe's beta2."""
        return (0.9, self.adam_beta2)

    @property
    def chosen_layers(self) -> list[int]:
        """The target layers the recipe names for the heads to read (EAGLE-3's `layers`); empty: the
        method's own choice."""
        return list(getattr(self.settings, "layers", None) or [])


def common_fields() -> list[dataclasses.Field]:
    """TrainConfig's keys, read by every method (the section aside)."""
    return [f for f in fields(TrainConfig) if not f.metadata.get("section")]


def former_name(f: dataclasses.Field) -> str:
    """A method key's top-level name before the sections."""
    return f.metadata.get("old") or f.name


def key_default(f: dataclasses.Field) -> Any:
    """A key's default value."""
    return f.default_factory() if f.default_factory is not MISSING else f.default
