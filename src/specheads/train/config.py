"""The training recipe: a flat dataclass, read from YAML with `key=value` overrides.

Unknown keys are errors (with the nearest known key suggested), so a typo never trains silently
with a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from specheads.data.readers import check_max_bad_rows
from specheads.heads.method import Method
from specheads.train.medusa2 import LORA_TARGET_MODULES
from specheads.train.optimizers import MUON_DTYPES, OPTIMIZERS, muon_missing
from specheads.train.tracking import report_to_problem

MIXED_PRECISION = ("no", "bf16", "fp16")
LR_SCHEDULES = ("cosine", "linear")
MODES = ("online", "offline")


@dataclass
class TrainConfig:
    # what to train
    method: str = "medusa"
    target: str = (
        "tiny"  # a local HF directory, a hub name, or "tiny" (the embedded default, built if needed)
    )
    target_dtype: str = "float32"
    attn_implementation: str = (
        "auto"  # "auto": sdpa, or eager where transformers refuses sdpa (Gemma-2, gpt-oss)
    )
    mode: str = "online"  # "online": the target runs every batch; "offline": read its states from cache_dir
    cache_dir: str = ""  # the hidden-state cache (`specheads cache` writes it; offline mode reads it)
    # data
    data: list[str] = field(
        default_factory=lambda: ["stdlib"]
    )  # sources; "stdlib" = the tiny target's training files
    eval_data: list[str] = field(
        default_factory=list
    )  # held-out sources; empty: split off eval_fraction of data
    eval_fraction: float = 0.02  # of the rows; of the distinct prompts when a prompt has several answers
    max_length: int = 512
    packing: bool = False
    loss_on: str = "assistant"  # for chat rows: "assistant", "last_assistant" or "all"
    max_bad_rows: int | float = 0.01  # rows that cannot be read or masked: a count, or a fraction; more stops
    include_capped: bool = False  # train on distilled rows whose answer was cut off at max_new_tokens too
    # fewer label tokens (loss_mask 1) than these, in all training rows or a row on average, stops the run:
    # empty assistant turns leave one or two (the end-of-turn marker) a row
    min_label_tokens: int = 16
    min_label_tokens_per_row: float = 3.0
    # Medusa
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = False
    decay: float = 0.8  # loss weight of Medusa head k, and of EAGLE-3 step k, is decay**k
    labels: str = (
        "data"  # "data": the text's tokens; "target": the target's distribution; "target-top1": its top token
    )
    # Medusa-2 (train/medusa2.py): LoRA adapters on the target, trained with the heads
    lora_r: int = 32
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(LORA_TARGET_MODULES)
    )  # the last component of the adapted linear layers' names
    lr_adapter: float = 1e-4  # the adapters' learning rate (the heads take `lr`)
    lambda0: float = 0.2  # the heads' loss weight at the end of its warm-up (L = KL + λ0 · L_heads)
    lambda0_schedule: str = "sine"  # "sine", "linear" or "constant"
    lambda0_warmup: float = 1.0  # fraction of max_steps the λ0 warm-up lasts
    # EAGLE-1/2 (labels are always the target's features and distributions)
    w_feat: float = 1.0  # weight of the feature loss, SmoothL1(f̂_{t+1}, f_{t+1})
    w_tok: float = 0.1  # weight of the token loss, soft cross-entropy against the target
    noise: float = 0.1  # training adds U(-noise, noise) to the input features
    fc_bias: bool = True
    # EAGLE-3
    eagle3_layers: list[int] = field(
        default_factory=list
    )  # target layers fused, HF hidden_states indexing, ascending; empty: (2, L//2, L-3), (1, L//2, L-1) for L < 7
    draft_vocab_size: int = 32000  # most frequent label tokens of the data; capped at the target's vocab
    ttt_steps: int = 7  # training-time-test steps
    # training adds U(-a, a) to each captured target layer (EAGLE-1's feature noise; the paper's EAGLE-3: 0)
    eagle3_noise: float = 0.0
    # the draft's labels: softmax(target logits / T) over the draft vocabulary. 1: the target's distribution
    # (the paper's and both peers'); 0: its top token alone (hard cross-entropy); above 1: softer
    eagle3_teacher_temperature: float = 1.0
    # positions whose target token lies outside the draft vocabulary: "skip" (untrained: the draft cannot
    # propose the token greedy verification wants there) or "train" (Model Optimizer's: against the target's
    # distribution renormalised over the draft vocabulary)
    eagle3_out_of_vocab: str = "skip"
    # HASS's top-K distillation (Zhang et al. 2024, "harmonized objective distillation"): each position's loss
    # adds weight x -sum over the target's K most likely draft-vocabulary tokens of p log q, p the target's
    # distribution (temperature 1) over the draft vocabulary, q the draft's. 0: off (HASS's trainer's defaults are
    # K 10, weight 1: level with the SmolLM2 recipe's loss on all 80 MT-Bench first turns,
    # benchmarks/records/eagle3-smollm2/2026-12-06-hass/)
    eagle3_topk_loss: int = 0
    eagle3_topk_loss_weight: float = 1.0
    # the draft's lm_head and final norm at the start: "random" (the layer's own init, as SpecForge and Model
    # Optimizer start), or "target": the target's lm_head rows of the draft vocabulary and its final norm
    draft_head_init: str = "random"
    # the draft layer's rope theta; 0: the target's. Model Optimizer's EAGLE-3 draft uses 10000 whatever the
    # target (SmolLM2's own is 100000); exports write the draft's, as the engines build it from there
    draft_rope_theta: float = 0.0
    # EAGLE / EAGLE-3 draft layer: "llama" (the engines', sized from any target) or "target" (its own family)
    draft_arch: str = "llama"
    # optimisation
    batch_size: int = 8  # per process, per micro-step
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    # AdamW's beta2: PyTorch's and the HF Trainer's 0.999 (Model Optimizer, medusa-llm); EAGLE's main.py 0.95
    adam_beta2: float = 0.999
    # "adamw", or "muon": torch's Muon on the heads' hidden matrices at muon_lr_scale x lr, AdamW at lr on
    # the rest (lm_head, norms, biases; train/optimizers.py). Not with DeepSpeed or FSDP, whose sharding
    # splits the matrices Muon orthogonalises whole, nor Medusa-2, which builds its own optimizer
    optimizer: str = "adamw"
    muon_lr_scale: float = 8.0  # Muon's updates are scaled to AdamW's RMS: 1 would take AdamW's step size
    # the dtype of Muon's Newton-Schulz products: "auto" is torch's bf16 wherever bf16 products are fast (an
    # accelerator, or a CPU with bf16 matrix instructions: AVX512-BF16, AMX), else fp32; or "float32" /
    # "bfloat16" whatever the machine (train/optimizers.py newton_schulz_dtype)
    muon_dtype: str = "auto"
    warmup_steps: int = 50
    # the warm-up as a fraction of max_steps instead, ceil(warmup_ratio * max_steps) steps as the HF Trainer
    # counts its warmup_ratio, so that it follows a max_steps= override; set warmup_steps to 0 with it
    warmup_ratio: float = 0.0
    # after the warm-up: "cosine" to a tenth of lr at max_steps, or "linear" to 0 at max_steps (the HF
    # Trainer's `linear`, Model Optimizer's and medusa-llm's recipes' schedule)
    lr_schedule: str = "cosine"
    max_steps: int = 1000  # optimizer steps
    max_grad_norm: float = 1.0
    mixed_precision: str = "no"
    seed: int = 0  # draws the heads' initial weights, and orders the training rows unless data_seed does
    data_seed: int = -1  # orders the training rows (each epoch's shuffle); -1: seed's (HF's data_seed)
    # evaluation, logging, checkpoints
    topk: int = 5
    eval_every: int = 200
    eval_batches: int = 20
    # online: the target's states over those batches, kept in host memory from the first evaluation so that
    # later ones run only its lm_head (train/held_out.py), up to this many MiB; 0 runs it every time
    eval_cache_mib: int = 1024
    save_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 0  # keep the newest N checkpoints/step-K; 0 keeps all
    allow_target_mismatch: bool = (
        False  # resume onto a target whose weights fingerprint differs (--allow-target-mismatch)
    )
    resume: str = ""  # "": start afresh; "auto": the latest whole checkpoint in output_dir, if any; or a path
    log_every: int = 10
    output_dir: str = "runs/medusa"
    num_workers: int = 0
    # glibc keeps the memory torch frees, so a CPU step does not fault its pages in again (train/host_memory.py)
    keep_host_memory: bool = True
    # tracking
    # accelerate's trackers (train/tracking.py): "wandb" (offline without WANDB_API_KEY), "tensorboard", ...,
    # several as a list ("tensorboard,wandb" on the command line), "all" installed, or "none"
    report_to: list[str] = field(default_factory=lambda: ["wandb"])
    wandb_project: str = "specheads"  # the project's name in every tracker that takes one
    run_name: str = ""  # the run's name in every tracker that takes one; empty: they pick one

    @property
    def warmup(self) -> int:
        """The warm-up's optimizer steps: warmup_steps, or ceil(warmup_ratio * max_steps) when that is set."""
        return math.ceil(self.warmup_ratio * self.max_steps) if self.warmup_ratio else self.warmup_steps

    def __post_init__(self):
        checks = [
            (
                self.loss_on in ("assistant", "last_assistant", "all"),
                f"loss_on must be 'assistant', 'last_assistant' or 'all', got {self.loss_on!r}",
            ),
            (self.mixed_precision in MIXED_PRECISION, f"mixed_precision must be one of {MIXED_PRECISION}"),
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
            (
                self.draft_arch in ("llama", "target"),
                f"draft_arch must be 'llama' or 'target', got {self.draft_arch!r}",
            ),
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
        for name in ("lr", "lr_adapter", "max_grad_norm", "muon_lr_scale"):
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
        return dataclasses.asdict(self)

    @property
    def adam_betas(self) -> tuple[float, float]:
        """AdamW's betas for every objective: PyTorch's beta1, the recipe's beta2."""
        return (0.9, self.adam_beta2)


def check_method(cfg: TrainConfig, methods: Mapping[str, Method]) -> None:
    """The checks of `cfg` that read the method table (`methods`, as `specheads.methods.methods()` gives it):
    its method is one of them, takes its optimizer and mode, and every entry's recipe keys hold good values
    (a bad value is an error whatever the method: a later method= override)."""
    if cfg.method not in methods:
        raise ValueError(f"bad recipe value: method must be one of {tuple(methods)}, got {cfg.method!r}")
    method = methods[cfg.method]
    checks = [
        (
            cfg.optimizer == "adamw" or method.objective is None,
            f"method {cfg.method!r} builds its own optimizer (AdamW over the heads and its adapters): "
            f"optimizer {cfg.optimizer!r} is not available for it, use 'adamw'",
        ),
        (
            not method.online_only or cfg.mode == "online",
            f"method {cfg.method!r} {method.online_only}, so it cannot read them from a cache: use mode 'online'",
        ),
    ]
    for entry in methods.values():
        checks += entry.check_recipe(cfg)
    for ok, message in checks:
        if not ok:
            raise ValueError(f"bad recipe value: {message}")


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Convert a YAML or command-line value to the field's type, or raise naming the key."""
    hint = typing.get_type_hints(TrainConfig)[name]
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):  # noqa: UP006
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ValueError(f"recipe key {name!r} takes a list, got {value!r}")
        item = (typing.get_args(hint) or (str,))[0]
        try:
            return [item(v) for v in value]
        except (TypeError, ValueError):
            raise ValueError(f"recipe key {name!r} takes a list of {item.__name__}, got {value!r}") from None
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        if type(value) in kinds:  # already one of them (max_bad_rows: an int count or a float fraction)
            return value
        hint = kinds[0]
    if hint is bool:
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes", "on"):
                return True
            if value.lower() in ("false", "0", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ValueError(f"recipe key {name!r} takes true/false, got {value!r}")
    try:
        if hint is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return hint(value)
    except (TypeError, ValueError):
        raise ValueError(f"recipe key {name!r} takes {hint.__name__}, got {value!r}") from None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """["lr=3e-4", "data=a.jsonl,b.jsonl"] -> {"lr": "3e-4", ...} (typed later, per key)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as e:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({_first_line(e)})") from None
    return out


def find_recipe(recipe: str | Path) -> Path:
    """A recipe path as given, or else one of the shipped recipes (`recipes/tiny/...`): inside an
    installed wheel (specheads/recipes) or in the source checkout of an editable install."""
    path = Path(recipe)
    if path.is_file():
        return path
    package = Path(__file__).resolve().parents[1]  # src/specheads (the wheel: site-packages/specheads)
    for root in (package, package.parents[1]):
        if not path.is_absolute() and (root / path).is_file():
            return root / path
    raise FileNotFoundError(
        f"recipe {recipe} not found (a file path, or a shipped one like recipes/tiny/medusa.yaml)"
    )


def _first_line(e: yaml.YAMLError) -> str:
    """A YAML error in one line: its problem and where (`line 3, column 5`)."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(e, 'problem', None) or str(e).splitlines()[0]}{where}"


def _reject_unknown(values: dict[str, Any], known: dict[str, Any], where: str) -> None:
    unknown = [k for k in values if k not in known]
    if unknown:
        hints = [
            f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, known, n=1)) else repr(k)
            for k in unknown
        ]
        raise ValueError(f"unknown recipe key{'s' if len(unknown) > 1 else ''} {where}: {', '.join(hints)}")


def load_config(
    recipe: str | Path | None, overrides: list[str] | dict[str, Any] = (), *, methods: Mapping[str, Method]
) -> TrainConfig:
    """Read a YAML recipe (or none: defaults), apply overrides, reject unknown keys; check it against the
    method table `methods` (`check_method`)."""
    values = recipe_values(recipe, overrides)
    known = {f.name: f for f in fields(TrainConfig)}
    typed = {k: _coerce(k, v, known[k].type) for k, v in values.items()}
    _warn_other_methods_keys(typed, recipe, methods)
    cfg = TrainConfig(**typed)
    check_method(cfg, methods)
    return cfg


def recipe_values(recipe: str | Path | None, overrides: list[str] | dict[str, Any] = ()) -> dict[str, Any]:
    """The keys a recipe and its overrides set, as written (unknown keys rejected; not yet typed or checked):
    what a caller reads to adjust a recipe that this machine would refuse (the quickstart's AdamW fallback)."""
    values: dict[str, Any] = {}
    known = {f.name: f for f in fields(TrainConfig)}
    if recipe is not None:
        path = find_recipe(recipe)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"recipe {path} is not valid YAML: {_first_line(e)}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"recipe {recipe} must be a mapping of keys to values")
        _reject_unknown(loaded, known, f"in {recipe}")
        values.update(loaded)
    overrides = parse_overrides(list(overrides)) if not isinstance(overrides, dict) else dict(overrides)
    _reject_unknown(overrides, known, "on the command line")
    values.update(overrides)
    return values


def _warn_other_methods_keys(values: dict[str, Any], recipe, table: Mapping[str, Method]) -> None:
    """A key set away from its default that only other methods read does nothing for this one: say so,
    naming whose it is (a whole saved config, every key at its value, says nothing)."""
    defaults = TrainConfig.__dataclass_fields__
    method = table.get(values.get("method", TrainConfig.method))
    if method is None:
        return  # TrainConfig names the known methods
    for key in values:
        owners = [name for name, m in table.items() if key in m.recipe_keys]
        default = (
            defaults[key].default_factory()
            if callable(defaults[key].default_factory)
            else defaults[key].default
        )
        if owners and key not in method.recipe_keys and values[key] != default:
            where = f"in {recipe}" if recipe is not None else "on the command line"
            warnings.warn(
                f"recipe key {key!r} {where} is read by method {', '.join(owners)} only; method "
                f"{method.name!r} ignores it",
                stacklevel=3,
            )
