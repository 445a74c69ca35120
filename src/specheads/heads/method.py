"""The `Method` type: what an entry of the method table (`specheads.methods`) holds for one kind of draft head.

An entry carries everything the rest of the code asks of a method: its head class and config, the
target layers its training reads, its objective and metrics, its recipe keys and their checks, its
drafter and calibration for decoding, and the export formats that hold it. The entry only holds callables
and data, so its type stands here on the heads floor, where checkpoint I/O (heads/checkpoint.py) and export
(heads/formats/) first need it: every floor above can name it in its parameters without importing the
table. The table itself, and the entries, which stand on every floor (a loss from train/, a drafter from
decode/), live on top in `specheads.methods`; a function below it that needs an entry takes it (or the
table, where it chooses by a checkpoint's method name) as a parameter, and the cli passes
`specheads.methods.methods()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass(frozen=True)
class Method:
    """One method's entry. `cfg` is the recipe (train/config.TrainConfig), `heads` the head module.

    head_class: the head module. Its `config_class` (class attribute) is the dataclass of its config
        (what a checkpoint's head_config holds), and its `capture_layers` (an attribute or property of a
        built head) the layer ids the loss asks the target's forward for (-1: the last).

    Training:
        build_heads(cfg, target, label_counts) -> (heads, notes for the checkpoint's training record);
            `label_counts` (V,) how often each token is a label in the training rows (EAGLE-3's draft
            vocabulary), counted once per run and saved with the heads.
        target_layers(num_layers, chosen) -> the target layer ids its training reads (HF hidden_states
            indexing: num_layers = after the final norm), `chosen` the ids the recipe names (EAGLE-3's
            eagle3_layers); what the hidden-state cache stores.
        loss(objective, batch, out, target) -> (loss, metrics (rows, columns) float64 sums); run inside
            `train.objective.HeadsWithLoss`, which holds `objective.heads` and the recipe's loss settings.
        needs_logits(cfg) -> whether the loss reads the target's logits.
        logit_columns(heads) -> the vocabulary ids of the only logits its loss reads besides their argmax
            (EAGLE-3's draft vocabulary), or None: all of them. Held-out evaluations after the first then
            compute only those from the target's kept last layer (train/held_out.py).
        metric_shape(cfg) -> (rows, columns) of the metric sums.
        summarise(cfg, sums) -> the logged means (with `loss` and `tau_sim`).
        metric_unit: what a metric column is ("head", "draft step"), for the final line.
        settings_class: the dataclass of the recipe keys only this method (or its family) reads, the
            recipe's section named after the method (`cfg.settings`); None: the method has no keys of its
            own. A recipe for another method that sets one is refused (train/recipe.py).
            check_recipe(cfg) -> [(ok, message)] checks their values.
        online_only: why its training cannot read the target's states from a cache ("" = it can).
        objective(cfg, target, heads) -> (module to train, optimizer, target) when it is not the
            default HeadsWithLoss + AdamW (Medusa-2: LoRA adapters trained with the heads).
        runs_target: the objective runs the target itself (called as `model(batch, weight)`).
        heads_weight(cfg, step) -> the heads' loss weight at a step, handed to such an objective.
        log_extras(cfg, step, lrs) -> what a train log record adds.
        after_prepare(accelerator, target) -> notes; save_extra(accelerator, target, out_dir): a method's
            own state beside the heads (Medusa-2's adapter).
    Decoding:
        drafter(heads, target, tree[, vocab=ids]) -> (drafter, results.json's record of its trees);
            `vocab` (ascending target ids, `--draft-vocab`) only where `draft_vocab` is "".
        draft_vocab: why its drafter takes no draft vocabulary ("" = it takes one: `--draft-vocab`).
        calibrate(heads, target, prompt_ids, settings[, vocab=ids]) -> (candidates, acceptance record,
            capture layers, greedy sequences) for `--tree auto`; None: the method has no calibration.
        max_tree_depth(heads, settings) -> the deepest tree a draft reaches.
        check_tree(tree): refuse a `--tree` name its drafter cannot use, before any work.
        default_tree: the `--tree` of an eval or compare that names none: "auto" (calibrated, where the run
            can calibrate), or None: the drafter's own default (decode/drafter_factory.tree_by_default).
    Export:
        export_formats: the `specheads export` formats that hold its heads.
        refused_formats: format -> why it cannot hold them, where a user would expect it to.
    """

    name: str
    head_class: type[nn.Module]
    build_heads: Callable[..., tuple[nn.Module, dict]]
    target_layers: Callable[[int, Any], tuple[int, ...]]
    metric_shape: Callable[[Any], tuple[int, int]]
    summarise: Callable[[Any, Any], dict[str, float]]
    loss: Callable[..., tuple[Any, Any]] | None = None
    drafter: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    draft_vocab: str = "its drafter proposes from the whole vocabulary"
    needs_logits: Callable[[Any], bool] = lambda cfg: True
    logit_columns: Callable[[nn.Module], Any] | None = None
    metric_unit: str = "draft step"
    settings_class: type | None = None
    check_recipe: Callable[[Any], list[tuple[bool, str]]] = lambda cfg: []
    online_only: str = ""
    objective: Callable[..., tuple[Any, Any, Any]] | None = None
    runs_target: bool = False
    heads_weight: Callable[[Any, int], float] = lambda cfg, step: 0.0
    log_extras: Callable[[Any, int, list[float]], dict[str, float]] = lambda cfg, step, lrs: {}
    after_prepare: Callable[[Any, Any], dict[str, Any]] = lambda accelerator, target: {}
    save_extra: Callable[[Any, Any, Any], None] | None = None
    calibrate: Callable[..., tuple] | None = None
    max_tree_depth: Callable[[Any, Any], int] = lambda heads, settings: settings.max_depth
    check_tree: Callable[[str], None] = lambda tree: None
    default_tree: str | None = None
    export_formats: tuple[str, ...] = ()
    refused_formats: dict[str, str] = field(default_factory=dict)

    @property
    def config_class(self) -> type:
        """The dataclass of the head's config (the head class's `config_class`)."""
        return self.head_class.config_class


def at_least(section: str, settings: Any, key: str, low: float, note: str = "") -> tuple[bool, str]:
    """A `check_recipe` row: `section.key` must be >= `low` (`note` says what the bound means)."""
    value = getattr(settings, key)
    return value >= low, f"{section}.{key} must be >= {low}{f' ({note})' if note else ''}, got {value}"


def one_of(section: str, settings: Any, key: str, choices: tuple[str, ...]) -> tuple[bool, str]:
    """A `check_recipe` row: `section.key` must be one of `choices`."""
    value = getattr(settings, key)
    return value in choices, f"{section}.{key} must be one of {tuple(choices)}, got {value!r}"
