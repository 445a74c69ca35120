"""Helpers for the decoder tests: greedy references, random prompts and an oracle drafter.

Random Medusa heads on a random tiny target accept about one token per step, which never exercises
multi-token acceptance. The oracle drafter knows the target's greedy continuation (computed
autoregressively beforehand) and puts it on some branches of the tree, so whole paths are accepted and
EOS / max_new_tokens can fall inside an accepted path.
"""

from __future__ import annotations

import random

import torch

from specheads.decode import DraftContext, DraftTree, StaticTree


def greedy_continuation(model, prompt: torch.Tensor, n: int) -> list[int]:
    """The target's own greedy continuation of `prompt` (1, T), n tokens, never stopping at EOS."""
    out = model.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, prompt.shape[1] :].tolist()


def reference_generate(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """(1, k) what `model.generate(do_sample=False)` emits after the prompt (its own EOS rules)."""
    return model.generate(prompt, max_new_tokens=n, do_sample=False)[:, prompt.shape[1] :]


class OracleDrafter:
    """Proposes a static tree in which the true greedy continuation sits on a random branch.

    At each step and depth d it draws which rank holds the true token after the root (or none, with
    probability `miss`); every other node gets a token that differs from the truth. The accepted path
    then follows the drawn ranks as deep as the tree has them, and stops at the first miss.

    `verified` records, per step, how many tokens the oracle expects the step to emit (the accepted
    path + bonus), before any EOS / max_new_tokens cut.
    """

    capture_layers = (-1,)

    def __init__(
        self, prompt: torch.Tensor, truth: list[int], tree: StaticTree, vocab_size: int, miss=0.25, seed=0
    ):
        self.sequence = prompt[0].tolist() + truth
        self.tree, self.vocab_size, self.miss = tree, vocab_size, miss
        self.rng = random.Random(seed)
        self.ranks_at_depth = {
            d: sorted({r for r, dd in zip(tree.ranks, tree.depths) if dd == d})
            for d in range(1, tree.max_depth + 1)
        }
        self.verified: list[int] = []

    def propose(self, context: DraftContext) -> DraftTree:
        assert context.tokens[0].tolist() == self.sequence[: context.tokens.shape[1]], (
            "decoder left the greedy path"
        )
        root_at = context.tokens.shape[1] - 1
        true_rank = {
            d: None if self.rng.random() < self.miss else self.rng.choice(ranks)
            for d, ranks in self.ranks_at_depth.items()
        }
        tokens = [self.sequence[root_at]]
        for path in self.tree.choices:
            d, rank = len(path), path[-1]
            truth = self.sequence[root_at + d] if root_at + d < len(self.sequence) else 0
            tokens.append(truth if rank == true_rank[d] else (truth + 1 + rank) % self.vocab_size)
        accepted: tuple[int, ...] = ()
        for d in range(1, self.tree.max_depth + 1):
            if true_rank[d] is None or (*accepted, true_rank[d]) not in self.tree.choices:
                break
            accepted = (*accepted, true_rank[d])
        self.verified.append(len(accepted) + 1)
        return DraftTree(
            tokens=torch.tensor([tokens]),
            parents=torch.tensor([self.tree.parents]),
        )


def random_prompts(n: int, seed: int = 0, low: int = 2, high: int = 24) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (1, t), generator=g) for t in lengths]


def recording(drafter_class: type) -> type:
    """A subclass of `drafter_class` whose instances keep every tree they propose (`.trees`)."""

    class Recording(drafter_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.trees = []

        def propose(self, context):
            self.trees.append(super().propose(context))
            return self.trees[-1]

    return Recording
