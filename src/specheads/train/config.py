"""The training recipe: the keys every method reads (`TrainConfig`), then the method's own section.

A recipe names its method, sets the common keys at the top level, and the method's keys in a section
named after it (the dataclass its module owns, `Method.settings_class`; `cfg.settings` holds it):

    method: eagle3
    lr: 3.0e-4
    eagle3: {draft_vocab_size: 8192, ttt_steps: 7}

Command-line overrides are `key=value`, and `eagle3.draft_vocab_size=4096` for a section's key. Method keys
at the top level (`draft_vocab_size: 8192`, as recipes and checkpoints written before the sections have
them) still load, with a message naming their new place. Unknown keys, a key in another method's section,
duplicate keys and empty recipe files are errors naming the file, the key and the fix, so a typo never
trains silently with a default.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

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


def _coerce(label: str, value: Any, hint: Any) -> Any:
    """Convert a YAML or command-line value to the key's type, or raise naming the key (`label`)."""
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):  # noqa: UP006
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ValueError(f"recipe key {label!r} takes a list, got {value!r}")
        item = (typing.get_args(hint) or (str,))[0]
        try:
            return [item(v) for v in value]
        except (TypeError, ValueError):
            raise ValueError(f"recipe key {label!r} takes a list of {item.__name__}, got {value!r}") from None
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            if type(None) in typing.get_args(hint):  # a key whose default is "unset" (enable_thinking)
                return None
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
        raise ValueError(f"recipe key {label!r} takes true/false, got {value!r}")
    try:
        if hint is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return hint(value)
    except (TypeError, ValueError):
        raise ValueError(f"recipe key {label!r} takes {hint.__name__}, got {value!r}") from None


def _settings_from(method: str, section: dict[str, Any], table: Mapping[str, Method]):
    """`method`'s section dataclass from its keys' values as written (typed here; unknown keys refused)."""
    cls = settings_class(table[method])
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = [k for k in section if k not in names]
    if unknown:
        raise ValueError(
            f"unknown recipe key {method}.{unknown[0]} (method {method!r} reads {sorted(names)})"
        )
    return cls(**{k: _coerce(f"{method}.{k}", v, hints[k]) for k, v in section.items()})


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


class _RecipeLoader(yaml.SafeLoader):
    """yaml's SafeLoader that refuses a key written twice in one mapping, at any level (yaml's own keeps
    the last silently)."""


class _KeySetTwice(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"key {key!r} is set twice")
        self.key, self.line, self.first = key, line, first


def _unique_keys_mapping(loader: _RecipeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, typing.Hashable) and key in seen:
            raise _KeySetTwice(key, key_node.start_mark.line + 1, seen[key])
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_RecipeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys_mapping)


def read_recipe(path: Path) -> dict[str, Any]:
    """A recipe file's mapping, as written: not valid YAML, a key set twice, no keys at all (an empty file,
    or comments only) or not a mapping are errors naming the file and the line."""
    text = Path(path).read_text()
    try:
        loaded = yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader)
    except _KeySetTwice as e:
        raise ValueError(
            f"recipe {path} at line {e.line}: key {e.key!r} is set twice (first at line {e.first}); keep one"
        ) from None
    except yaml.YAMLError as e:
        raise ValueError(f"recipe {path} is not valid YAML: {_first_line(e)}") from None
    if loaded is None:
        raise ValueError(
            f"recipe {path} at line 1: the file sets no keys (it is empty, or comments only); "
            "a recipe names at least its method, e.g. `method: medusa`"
        )
    if not isinstance(loaded, dict):
        raise ValueError(f"recipe {path} must be a mapping of keys to values")
    return loaded


def _section_fields(method: Method) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in fields(settings_class(method))}


def former_name(f: dataclasses.Field) -> str:
    """A method key's top-level name before the sections."""
    return f.metadata.get("old") or f.name


def _flat_owners(name: str, table: Mapping[str, Method]) -> list[tuple[str, str]]:
    """(method, key in its section) of every method whose section holds top-level key `name` of old."""
    return [
        (m, f.name) for m, e in table.items() for f in _section_fields(e).values() if former_name(f) == name
    ]


def _place(method: str, key: str, where: str) -> str:
    """Where a method's key goes, written as `where` takes it (a recipe file, or the command line)."""
    return f"{method}.{key}=..." if where == "on the command line" else f"{method}: {{{key}: ...}}"


def _misplaced(owner: str, key: str, where: str, table: Mapping[str, Method]) -> str:
    """The error for `key` in method `owner`'s section, which does not read it, naming its right place."""
    own = _section_fields(table[owner])
    renamed = [f.name for f in own.values() if former_name(f) == key]
    others = [(m, f) for m, f in _flat_owners(key, table) if m != owner]
    others += [(m, key) for m, e in table.items() if m != owner and key in _section_fields(e)]
    if key in {f.name for f in common_fields()}:
        fix = f"every method reads {key!r}: set it at the top level ({key}: ...)"
    elif renamed:
        fix = f"use {_place(owner, renamed[0], where)}"
    elif others:
        methods_of = ", ".join(dict.fromkeys(m for m, _ in others))
        fix = f"{key!r} is read by method {methods_of}: use {_place(*others[0], where)}"
    elif close := difflib.get_close_matches(key, own, n=1):
        fix = f"did you mean {owner}.{close[0]}?"
    else:
        fix = f"method {owner!r} reads {', '.join(own) or 'no keys of its own'}"
    return f"unknown recipe key {owner}.{key} {where}: {fix}"


def _unknown(names: list[str], method: str, where: str, table: Mapping[str, Method]) -> str:
    """The error for top-level keys no method reads, with the nearest known key each."""
    known = {f.name: f.name for f in common_fields()}
    known |= {f"{m}.{k}": f"{m}.{k}" for m, e in table.items() for k in _section_fields(e)}
    known |= {k: f"{method}.{k}" for k in _section_fields(table[method])}
    hints = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r} (did you mean {known[close[0]]!r}?)" if close else repr(name))
    return f"unknown recipe key{'s' if len(names) > 1 else ''} {where}: {', '.join(hints)}"


def key_default(f: dataclasses.Field) -> Any:
    """A key's default value."""
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _sectioned(
    layers: list[tuple[str, dict[str, Any]]], table: Mapping[str, Method], record: bool = False
) -> dict[str, Any]:
    """The keys `layers` ((where, mapping), later ones overriding) set, as {common key: value, ...,
    method: {its key: value}}: the method first, then each key to its place. A top-level method key (the
    form before sections) moves into the method's section with a RecipeKeyMoved message; one that only
    other methods read, or another method's section, is ignored with a message; unknown keys are errors.
    `table`: the method table (`specheads.methods.methods()`). `record`: a checkpoint's record, read quietly
    (its notes and other methods' keys ignored)."""
    method = TrainConfig.method
    for _, values in layers:
        method = values.get("method", method)
    if not isinstance(method, str) or method not in table:
        raise ValueError(f"bad recipe value: method must be one of {tuple(table)}, got {method!r}")
    common = {f.name for f in common_fields()}
    out: dict[str, Any] = {}
    section: dict[str, Any] = {}
    for where, values in layers:
        sectioned = isinstance(values.get(method), dict)  # a record's flat keys beside it are its notes
        unknown, ignored = [], []
        for name, value in values.items():
            name = str(name)
            owner, dot, key = name.partition(".")
            if name in common:
                out[name] = value
            elif name in table or (dot and owner in table):
                if not dot and value is not None and not isinstance(value, dict):
                    raise ValueError(
                        f"recipe key {name!r} {where} is method {name}'s section: it takes a mapping of "
                        f"that method's keys, e.g. {name}: {{key: value}}"
                    )
                items = {key: value} if dot else (value or {})
                for k, v in items.items():
                    if str(k) not in _section_fields(table[owner]):
                        if record:
                            continue
                        raise ValueError(_misplaced(owner, str(k), where, table))
                    if owner == method:
                        section[str(k)] = v
                    elif owner not in ignored:
                        ignored.append(owner)
            elif moved := _flat_owners(name, table):
                if record and sectioned:
                    continue
                mine = [k for m, k in moved if m == method]
                if mine:
                    section[mine[0]] = value
                    if not record:
                        warnings.warn(
                            RecipeKeyMoved(
                                f"recipe key {name!r} {where} is method {method}'s: use "
                                f"{_place(method, mine[0], where)} (method keys at the top level are deprecated)"
                            ),
                            stacklevel=4,
                        )
                elif not record:
                    first, key = moved[0]
                    f = _section_fields(table[first])[key]
                    hint = typing.get_type_hints(settings_class(table[first]))[key]
                    if _coerce(name, value, hint) != key_default(f):
                        owners = ", ".join(dict.fromkeys(m for m, _ in moved))
                        warnings.warn(
                            f"recipe key {name!r} {where} is read by method {owners} only; method {method!r} "
                            f"ignores it (its place: {_place(first, key, where)})",
                            stacklevel=4,
                        )
            elif not record:
                unknown.append(name)
        if unknown:
            raise ValueError(_unknown(unknown, method, where, table))
        for owner in ignored:
            warnings.warn(
                f"recipe section {owner!r} {where} is read by method {owner} only; method {method!r} ignores it",
                stacklevel=4,
            )
    if section:
        out[method] = section
    return out


def recipe_values(
    recipe: str | Path | None, overrides: list[str] | dict[str, Any] = (), *, methods: Mapping[str, Method]
) -> dict[str, Any]:
    """The keys a recipe and its overrides set, as written, in sections: {common key: value, ...,
    method: {its key: value}} (unknown keys rejected; not yet typed or checked): what a caller reads to
    adjust a recipe that this machine would refuse (the quickstart's AdamW fallback). `methods`: the method
    table (`specheads.methods.methods()`), which names each method's section."""
    layers = []
    if recipe is not None:
        layers.append((f"in {recipe}", read_recipe(find_recipe(recipe))))
    overrides = parse_overrides(list(overrides)) if not isinstance(overrides, dict) else dict(overrides)
    layers.append(("on the command line", overrides))
    return _sectioned(layers, methods)


def _config_from(values: dict[str, Any], table: Mapping[str, Method]) -> TrainConfig:
    hints = typing.get_type_hints(TrainConfig)
    method = values.get("method", TrainConfig.method)
    typed = {
        f.name: _coerce(f.name, values[f.name], hints[f.name]) for f in common_fields() if f.name in values
    }
    cfg = TrainConfig(**typed, settings=dict(values.get(method, {})))
    check_method(cfg, table)
    return cfg


def check_method(cfg: TrainConfig, methods: Mapping[str, Method]) -> None:
    """What `cfg` needs the method table for (`methods`, as `specheads.methods.methods()` gives it): its
    method is one of them; its section (`cfg.settings`: None for the defaults, a mapping of the section's
    keys, or the method's settings object) becomes the method's settings object; and the method takes the
    recipe's optimizer and mode, and its own checks pass."""
    if cfg.method not in methods:
        raise ValueError(f"bad recipe value: method must be one of {tuple(methods)}, got {cfg.method!r}")
    method = methods[cfg.method]
    cls = settings_class(method)
    if cfg.settings is None:
        cfg.settings = cls()
    elif isinstance(cfg.settings, dict):
        cfg.settings = _settings_from(cfg.method, cfg.settings, methods)
    elif type(cfg.settings) is not cls:
        raise ValueError(
            f"bad recipe value: method {cfg.method!r} reads its keys from a {cls.__name__}, "
            f"got {type(cfg.settings).__name__}"
        )
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
        *method.check_recipe(cfg),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"bad recipe value: {message}")


def load_config(
    recipe: str | Path | None, overrides: list[str] | dict[str, Any] = (), *, methods: Mapping[str, Method]
) -> TrainConfig:
    """Read a YAML recipe (or none: defaults), apply overrides (`key=value`, `method.key=value`), type and
    check every value against the method table `methods` (`specheads.methods.methods()`)."""
    return _config_from(recipe_values(recipe, overrides, methods=methods), methods)


def config_from_record(record: dict[str, Any], *, methods: Mapping[str, Method]) -> TrainConfig:
    """The recipe a training record holds (a checkpoint's state, or the heads' config.json "training"),
    in sections or in the flat form written before them, read quietly: the record's notes (the resolved
    target, the step, the last evaluation, ...) and keys no method reads are left aside."""
    return _config_from(_sectioned([("in the training record", dict(record))], methods, record=True), methods)
