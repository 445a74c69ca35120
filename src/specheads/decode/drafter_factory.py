"""The drafter that decodes a checkpoint's heads over a named tree (`--tree`): the method table's drafter
factory.

`drafter_for` asks the heads' method (its `Method` entry, chosen from the table it is given by the
checkpoint's method name) for its drafter; the methods' own `drafter`s are built here (`medusa_drafter_for`,
`eagle_drafter_for`). `--tree auto` picks a tree by measuring instead (decode/calibrate.py,
evaluate/calibrate.py) and builds its drafter with the same helpers, so results.json records every tree
alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.drafters import Drafter, MedusaDrafter
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.trees import DEFAULT_TREES, StaticTree, default_tree
from specheads.heads.method import Method


def default_tree_name(num_heads: int) -> str:
    """A default tree for `num_heads` Medusa heads (a heuristic; `--tree` overrides it).

    Few heads cannot fill a deep tree, and Medusa's 63-node tree cut to two heads is 38 nodes of mostly
    width, paid for in every tree forward; so the tree grows with the heads.
    """
    if num_heads <= 2:
        return "medusa-15"
    return "medusa-31" if num_heads == 3 else "medusa-63"


# EAGLE-2 dynamic trees: children per expanded node, levels below the root, nodes verified per step
# (root included). Smaller than the paper's (10, 6, 60), which is sized for a GPU's wide forward.
EAGLE_TOP_K, EAGLE_DEPTH, EAGLE_TOTAL_TOKENS = 8, 5, 32


def tree_by_default(method: str | None, calibrates: bool, *, methods: Mapping[str, Method]) -> str | None:
    """The tree of a run whose `--tree` names none: its method's `default_tree` (its entry in `methods`, the
    method table), its "auto" only where the run can calibrate (`calibrates`: greedy, one prompt at a time,
    prompts enough to hold some out); otherwise None, the drafter's own default (`drafter_for`)."""
    entry = methods.get(method)
    tree = None if entry is None else entry.default_tree
    return None if tree == "auto" and not calibrates else tree


def dynamic_size(tree: str | None) -> int | None:
    """N of a `dynamic[-N]` tree name (the default size for plain `dynamic`); None for any other name."""
    if tree is None or not tree.startswith("dynamic"):
        return None
    return int(tree.split("-", 1)[1]) if "-" in tree else EAGLE_TOTAL_TOKENS


def static_record(name: str, tree: StaticTree) -> dict[str, Any]:
    """results.json's record of a static tree."""
    return {"name": name, "nodes": tree.num_nodes, "depth": tree.max_depth, "choices": tree.choices}


def medusa_drafter(
    heads: torch.nn.Module,
    target: FrozenTarget,
    tree: StaticTree,
    name: str,
    vocab: torch.Tensor | None = None,
) -> tuple[MedusaDrafter, dict[str, Any]]:
    """Medusa heads over a static tree (proposing from `vocab` when given), and results.json's record of the
    tree."""
    lm_head = target.lm_head if heads.config.share_lm_head else None
    return MedusaDrafter(heads, tree, lm_head=lm_head, vocab=vocab), static_record(name, tree)


def dynamic_drafter(
    head: torch.nn.Module,
    target: FrozenTarget,
    *,
    top_k: int,
    depth: int,
    total_tokens: int,
    name: str,
    vocab: torch.Tensor | None = None,
) -> tuple[EagleDrafter, dict[str, Any]]:
    """An EAGLE head growing EAGLE-2 dynamic trees (from `vocab` when given), and results.json's record."""
    drafter = EagleDrafter(head, target, top_k=top_k, depth=depth, total_tokens=total_tokens, vocab=vocab)
    return drafter, {"name": name, "nodes": total_tokens, "depth": depth, "top_k": top_k}


def check_tree_for_method(method: str | None, tree: str | None, *, methods: Mapping[str, Method]) -> None:
    """Refuse a `--tree` the heads cannot draw (the method's `check_tree`, its entry in `methods`), before
    any work."""
    entry = methods.get(method)
    if entry is not None and tree is not None:
        entry.check_tree(tree)


def static_tree_only(tree: str) -> None:
    """Medusa's `Method.check_tree`: dynamic trees grow from an EAGLE head's own features."""
    if dynamic_size(tree) is not None:
        raise ValueError(
            f"--tree {tree}: dynamic trees are for EAGLE heads; these are Medusa heads, which take a "
            f"static tree ({', '.join(sorted(DEFAULT_TREES))}, chain-K) or auto"
        )


def drafter_for(
    heads: torch.nn.Module,
    config: dict[str, Any],
    target: FrozenTarget,
    tree: str | dict[str, Any] | None,
    vocab: torch.Tensor | None = None,
    *,
    methods: Mapping[str, Method],
) -> tuple[Drafter, dict[str, Any]]:
    """The drafter for a checkpoint's heads and a tree: its method's `drafter` (its entry in `methods`, the
    method table).

    Args:
        heads: the loaded heads (`load_heads`).
        config: the checkpoint's config.json; its "method" picks the drafter.
        target: the frozen target the heads read.
        tree: the `--tree` name, None for the method's default, or a tree as the returned record describes
            it (`--tree auto`'s choice, rebuilt on resume).
        vocab: the draft vocabulary (`--draft-vocab`, `draft_vocab_ids`) for EAGLE-1/2 and Medusa heads;
            None: the whole vocabulary (EAGLE-3 heads always draft over their own).

    Returns:
        The drafter, and what results.json records of its trees: at least "name", "nodes" and
        "depth" (the deepest a draft reaches: accept_rate_per_depth has that many entries).

    Raises:
        ValueError: for a method that has no drafter yet, or a tree it cannot use.
    """
    method = methods.get(config.get("method"))
    if method is None or method.drafter is None:
        known = ", ".join(name for name, m in methods.items() if m.drafter is not None)
        raise ValueError(
            f"`specheads eval` has no drafter for heads of method {config.get('method')!r}; it knows: {known}"
        )
    if isinstance(tree, str):
        method.check_tree(tree)
    if vocab is None:
        return method.drafter(heads, target, tree)
    if method.draft_vocab:
        raise ValueError(f"--draft-vocab: {method.draft_vocab} ({method.name} heads)")
    return method.drafter(heads, target, tree, vocab=vocab)


def draft_vocab_mask(drafter: Drafter, vocab_size: int) -> torch.Tensor | None:
    """A (vocab_size,) bool mask of the target ids `drafter` can propose: an EAGLE-3 head's draft vocabulary,
    or the `vocab` given to an EAGLE-1/2 or Medusa drafter (`--draft-vocab`); None when it proposes from the
    whole vocabulary. The decoder never drafts a token outside it, so a step whose next token lies outside
    accepts no draft token."""
    ids = getattr(drafter, "vocab", None)
    if ids is None and getattr(drafter, "draft_vocab_size", vocab_size) < vocab_size:
        ids = drafter.head.vocab_target_ids()  # an EAGLE-3 head's own, on the device of its d2t
    if ids is None:
        return None
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ids.cpu()] = True
    return mask


def medusa_drafter_for(
    heads: torch.nn.Module,
    target: FrozenTarget,
    tree: str | dict[str, Any] | None,
    vocab: torch.Tensor | None = None,
):
    """Medusa's `Method.drafter`: its heads over a static tree (`--tree`, a recorded tree, or one sized to
    the heads)."""
    if isinstance(tree, dict):  # a tree as results.json records it (a calibrated one, kept for a resume)
        static = StaticTree.from_choices(tree["choices"], num_heads=heads.num_heads)
        return medusa_drafter(heads, target, static, tree["name"], vocab)
    name = tree or default_tree_name(heads.num_heads)
    return medusa_drafter(heads, target, default_tree(name, num_heads=heads.num_heads), name, vocab)


def eagle_drafter_for(
    head: torch.nn.Module,
    target: FrozenTarget,
    tree: str | dict[str, Any] | None,
    vocab: torch.Tensor | None = None,
):
    """EAGLE's and EAGLE-3's `Method.drafter`: a static EAGLE-1 tree when `--tree` names one, else EAGLE-2
    dynamic trees (`dynamic-N`: N nodes verified a step), or the tree a record describes."""
    if isinstance(tree, dict) and "top_k" in tree:  # a recorded EAGLE-2 tree (a calibrated one)
        return dynamic_drafter(
            head,
            target,
            top_k=tree["top_k"],
            depth=tree["depth"],
            total_tokens=tree["nodes"],
            name=tree["name"],
            vocab=vocab,
        )
    if isinstance(tree, dict):  # a recorded static tree
        static = StaticTree.from_choices(tree["choices"])
        return EagleDrafter(head, target, static, vocab=vocab), static_record(tree["name"], static)
    if tree is not None and dynamic_size(tree) is None:
        static = default_tree(tree)  # an EAGLE-1 static tree: ranks of the head's own top-k per depth
        return EagleDrafter(head, target, static, vocab=vocab), static_record(tree, static)
    total = dynamic_size(tree) or EAGLE_TOTAL_TOKENS
    return dynamic_drafter(
        head,
        target,
        top_k=EAGLE_TOP_K,
        depth=EAGLE_DEPTH,
        total_tokens=total,
        name=f"dynamic-{total}",
        vocab=vocab,
    )
