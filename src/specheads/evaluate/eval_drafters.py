"""compare's trees per heads directory (`--tree`, one name or one each). The flags themselves are defined
on the cli floor (cli/eval_flags.py); the drafters are built on the decode floor (decode/drafter_factory.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from specheads.decode.drafter_factory import tree_by_default
from specheads.heads.method import Method


def trees_for(
    trees: list[str] | None, heads_methods: list[str], calibrates: bool, *, methods: Mapping[str, Method]
) -> list[str | None]:
    """`compare --tree`: one name for every heads directory, one each, or none: each one's default (its
    method's entry in `methods`)."""
    if trees:
        return trees * len(heads_methods) if len(trees) == 1 else list(trees)
    return [tree_by_default(method, calibrates, methods=methods) for method in heads_methods]
