"""Drafters: what proposes the tree the target verifies.

A drafter is anything with `capture_layers` and `propose(context) -> DraftTree` (the `Drafter`
protocol). The decoder captures those layers of the target on every forward and hands the drafter the
features of the positions that forward added to the cache, with every token accepted so far.

When the decoder samples (`context.sampling` set), a drafter may return a `SampledTree`: the tree plus
the draft's distribution q at each node and how each node's children were picked from it (CHILDREN).
The verifier needs q for children drawn from it (verify.py, rule (b)); a plain `DraftTree` is taken as
deterministic (top-k) children, which need no q (rule (a)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from specheads.decode.batched_inputs import Layout
from specheads.decode.sampling import SamplingParams, draft_probs, draw_children
from specheads.decode.trees import DraftTree, StaticTree, tree_children
from specheads.decode.verify import TypicalAcceptance

# How a drafter picks a node's children from the draft's distribution q at that node:
#   top-k                the most likely tokens, deterministically (Medusa, EAGLE; the default)
#   iid                  drawn independently from q (SpecInfer)
#   without-replacement  drawn one after another from q, each time without the ones drawn (Sequoia)
CHILDREN = ("top-k", "iid", "without-replacement")


@dataclass
class DraftContext:
    """What a drafter sees before proposing.

    tokens: (B, S + 1) the prompt and every token emitted so far; the last one is the root of the tree
        to propose (not in the KV cache yet), the S before it are cached.
    hidden: layer id (as the drafter asked for it) -> (B, n, H): the target's features at the n
        positions the last forward added to the cache (S - n .. S - 1): the whole prompt after prefill,
        the accepted path after a speculative step. hidden[...][:, -1] reads the root's predecessor,
        where the target's lm_head predicted the root.
    step: 0 right after prefill, then 1, 2, ... (a stateful drafter resets on 0).
    sampling: the generate call's temperature / top-k / top-p; None for greedy decoding.
    generator: the CPU generator every draw of the call uses (drafters drawing children use it too).
    acceptance: the verifier's rule when sampling: "exact" (lossless) or Medusa's typical acceptance
        (lossy); drafters ignore it.
    """

    tokens: torch.Tensor
    hidden: dict[int, torch.Tensor]
    step: int
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None
    acceptance: str | TypicalAcceptance = "exact"

    def as_rows(self) -> BatchDraftContext:
        """This context as rows of a cache layout without padding (B = 1 for one sequence): what a drafter
        that drafts for B rows at once reads (EagleDrafter)."""
        b, cached = self.tokens.shape[0], self.tokens.shape[1] - 1
        new = next((h.shape[1] for h in self.hidden.values()), 0)  # positions the last forward added
        device = self.tokens.device
        return BatchDraftContext(
            rows=torch.arange(b, device=device),
            roots=self.tokens[:, -1],
            layout=Layout.contiguous(cached, b, device),
            hidden=self.hidden,
            next_tokens=self.tokens[:, cached - new + 1 :],
            start=torch.full((b,), cached - new, dtype=torch.long, device=device),
            step=self.step,
            sampling=self.sampling,
            generator=self.generator,
            acceptance=self.acceptance,
        )


@dataclass
class BatchDraftContext:
    """What a batched drafter sees before proposing, for the B live rows.

    rows:        (B,) int64 each live row's index in the batch given to `generate`.
    roots:       (B,) int64 each row's root: its last emitted token, not in the cache yet.
    layout:      the cache layout after the last forward and its compaction.
    hidden:      layer id (as the drafter asked for it) -> (B, M, H): the target's features at the M
                 columns the last forward kept. Column i of row b now sits at slot start_b + i and is
                 real when that slot is one of the row's real slots: after prefill the whole padded
                 prompt (M = T, start = 0, padding not real); after a step the accepted path (the first
                 n_b columns, start = the row's length before the step).
    next_tokens: (B, M) int64 the token after each column (x_{p+1}); at the last real column, the root.
    start:       (B,) int64 (see hidden).
    step:        0 right after prefill, then 1, 2, ... (a stateful drafter resets on 0).
    sampling, generator, acceptance: as in DraftContext (None: greedy).
    """

    rows: torch.Tensor
    roots: torch.Tensor
    layout: Layout
    hidden: dict[int, torch.Tensor]
    next_tokens: torch.Tensor
    start: torch.Tensor
    step: int
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None
    acceptance: str | TypicalAcceptance = "exact"

    def as_rows(self) -> BatchDraftContext:
        return self

    def last_column(self) -> torch.Tensor:
        """(B,) each row's last real column: the root's predecessor, where the target predicted the root."""
        return self.layout.length - 1 - self.start

    def select(self, rows: torch.Tensor, layout: Layout) -> BatchDraftContext:
        return replace(
            self,
            rows=self.rows[rows],
            roots=self.roots[rows],
            layout=layout,
            hidden={k: h[rows] for k, h in self.hidden.items()},
            next_tokens=self.next_tokens[rows],
            start=self.start[rows],
        )


@dataclass
class SampledTree(DraftTree):
    """A draft tree proposed for sampling, with what the verifier needs to know of the draft.

    draft_probs: (B, N, V) q at each node: the draft's distribution over the token after it, in the
        target's vocabulary, from which the node's children were drawn or ranked (rows of leaves unused).
    children: how each node's children were picked from q (CHILDREN).
    """

    draft_probs: torch.Tensor | None = None
    children: str = "top-k"

    def __post_init__(self):
        super().__post_init__()
        check_children(self.children)


def check_children(children: str) -> str:
    if children not in CHILDREN:
        raise ValueError(f"children={children!r}: expected one of {CHILDREN}")
    return children


def check_vocab(vocab: torch.Tensor | None, vocab_size: int, device=None) -> torch.Tensor | None:
    """A drafter's `vocab` (the ascending target ids it proposes from; None: the whole vocabulary), checked
    to hold 1..vocab_size ids in one dimension, as int64 on `device`."""
    if vocab is None:
        return None
    if vocab.ndim != 1 or not 1 <= vocab.numel() <= vocab_size:
        raise ValueError(f"vocab must be 1..{vocab_size} target ids, got shape {tuple(vocab.shape)}")
    return vocab.to(device=device, dtype=torch.long)


class Drafter(Protocol):
    """Proposes draft trees from the target's features."""

    capture_layers: tuple[
        int, ...
    ]  # target layer ids to capture (FrozenTarget's indexing; -1 = last, after norm)

    def propose(self, context: DraftContext) -> DraftTree: ...


def sibling_index(parents: tuple[int, ...] | list[int]) -> list[int]:
    """Per node, its position among its parent's children (0 for the root): which draw it takes."""
    index = [0] * len(parents)
    for kids in tree_children(parents):
        for i, node in enumerate(kids):
            index[node] = i
    return index


class MedusaDrafter:
    """Medusa heads over a static tree: node (r_1..r_d) takes head d-1's rank-r_d guess.

    Head k reads the target's last feature at the root's predecessor t and predicts token t+2+k, i.e.
    the token k+1 steps after the root (which is token t+1): depth k+1 of the tree. Its distribution q
    is the draft's at every node of depth k (children="iid" / "without-replacement": each such node's
    children are drawn from it, the i-th child taking the i-th draw, when the decoder samples).
    """

    capture_layers = (-1,)

    def __init__(
        self,
        heads: nn.Module,
        tree: StaticTree,
        lm_head: nn.Module | None = None,
        *,
        children: str = "top-k",
        vocab: torch.Tensor | None = None,
    ):
        """
        Args:
            heads: `MedusaHeads` (K heads).
            tree: the static tree; no path may be deeper than K.
            lm_head: the target's lm_head, required when the heads share it.
            children: how children are picked when sampling (CHILDREN); greedy decoding always takes top-k.
            vocab: ascending target ids the heads propose from (a frequency-ranked draft vocabulary,
                `heads.checkpoint.draft_vocab_ids`): the projections keep those rows only. None: the whole
                vocabulary. The target verifies every draft, so the output is the same either way.
        """
        vocab = check_vocab(vocab, heads.config.vocab_size)
        draft_size = heads.config.vocab_size if vocab is None else vocab.numel()
        StaticTree.from_choices(tree.choices, num_heads=heads.num_heads, topk=draft_size)
        if heads.lm_heads is None and lm_head is None:
            raise ValueError("these Medusa heads share the target's lm_head: pass it as `lm_head`")
        self.heads, self.tree, self.lm_head = heads, tree, lm_head
        self.vocab = vocab
        self.children = check_children(children)
        # (N-1,) which head fills each candidate, and which of its top-k guesses
        self._head = torch.tensor(tree.depths[1:], dtype=torch.long) - 1
        self._rank = torch.tensor(tree.ranks[1:], dtype=torch.long)
        # (N,) the head whose distribution is q at each node (a leaf at depth K has no children: clamped)
        self._node_head = torch.tensor(tree.depths, dtype=torch.long).clamp(max=heads.num_heads - 1)
        self._kids = tree_children(tree.parents)
        # where and in what dtype the heads run, fixed when the drafter is built, as the projections' copy
        # below is (reading `next(heads.parameters())` each step walked the module tree: 10% of the tiny
        # target's Medusa draft)
        self._weight = next(heads.parameters())
        self._blocks = _stacked_blocks(heads)
        self._projection = _projection_t(heads, lm_head)
        if self._projection is not None and self.vocab is not None:  # (K or 1, H, Vd)
            self._projection = self._projection[:, :, self.vocab.to(self._projection.device)].contiguous()

    @torch.no_grad()
    def propose(self, context: DraftContext) -> DraftTree:
        weight = self._weight
        feature = context.hidden[-1][:, -1, :].to(weight.device, weight.dtype)  # (B, H) before the root
        features = feature.expand(self.heads.num_heads, -1, -1)  # (K, B, H)
        for w, b in self._blocks:  # every head's l-th residual block in one batched matmul
            features = features + F.silu(torch.baddbmm(b, features, w))
        if self._projection is None:
            if self.heads.lm_heads is None:
                logits = self.lm_head(features)  # (K, B, V)
            else:
                logits = torch.stack([p(x) for p, x in zip(self.heads.lm_heads, features)])
            if self.vocab is not None:
                logits = logits[..., self.vocab.to(logits.device)]  # (K, B, Vd)
        elif self._projection.shape[0] == 1:  # one shared projection: one (K*B, H) @ (H, V or Vd) matmul
            # (a broadcast (K, B, H) @ (1, H, V) runs a matrix-vector kernel per head: on this project's
            # CPU, 1 thread, SmolLM2's 576 x 49152, 41 ms against 23 in fp32 and 212 against 10 in bf16)
            k, b, h = features.shape
            logits = (features.reshape(k * b, h) @ self._projection[0]).view(k, b, -1)
        else:  # (K, B, H) @ (K, H, V or Vd): every head's own projection in one batched matmul
            logits = features @ self._projection
        device = logits.device
        q = None if context.sampling is None else draft_probs(logits, context.sampling)  # (K, B, V or Vd)
        if q is not None and self.vocab is not None:  # q over the target's vocabulary, 0 off the draft's
            q = q.new_zeros(*q.shape[:-1], self.heads.config.vocab_size).index_copy_(
                -1, self.vocab.to(device), q
            )
        if q is not None and self.children != "top-k":
            candidates = self._drawn(q, context.generator)  # (B, N-1)
        else:
            guesses = logits.topk(self.tree.topk, dim=-1).indices  # (K, B, topk)
            if self.vocab is not None:
                guesses = self.vocab.to(device)[guesses]
            candidates = guesses[self._head.to(device), :, self._rank.to(device)].T  # (B, N-1)
        root = context.tokens[:, -1:].to(device)  # (B, 1)
        tokens = torch.cat([root, candidates], dim=1)  # (B, N)
        shape = self.tree.shape(device)
        if q is None:
            return DraftTree.on_shape(tokens, shape)
        node_q = q[self._node_head.to(device)].transpose(0, 1)  # (B, N, V) q at each node
        return SampledTree.on_shape(tokens, shape, draft_probs=node_q, children=self.children)

    def batched(self) -> BatchedMedusaDrafter:
        """This drafter over B rows (batched decoding)."""
        return BatchedMedusaDrafter(self)

    def _drawn(self, q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(K, B, V) head distributions -> (B, N-1) candidates, each node's children drawn from its q."""
        batch = q.shape[1]
        tokens = torch.zeros(batch, self.tree.num_nodes, dtype=torch.long, device=q.device)
        for b in range(batch):
            for node, kids in enumerate(self._kids):
                if kids:
                    q_node = q[self._node_head[node], b]
                    tokens[b, kids] = draw_children(q_node, len(kids), self.children == "iid", generator)
        return tokens[:, 1:]


def _stacked_blocks(heads: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The heads' residual blocks, layer by layer, as one (K, H, H) weight (transposed: x @ W) and one
    (K, 1, H) bias each: a draft then runs layer l of all K heads in one `baddbmm`, not K module calls
    (those were half of the tiny target's Medusa draft, 1 thread). Copies, as `_projection_t`'s are."""
    layers = []
    for layer in range(heads.config.num_layers):
        linears = [block[layer].linear for block in heads.blocks]
        weight = torch.stack([m.weight.detach().t() for m in linears]).contiguous()
        layers.append((weight, torch.stack([m.bias.detach() for m in linears])[:, None]))
    return layers


def _projection_t(heads: nn.Module, lm_head: nn.Module | None) -> torch.Tensor | None:
    """The heads' vocabulary projections as one (K, H, V) tensor (1, H, V when they share the target's), for
    heads on the CPU; None elsewhere, or when a projection has a bias.

    A draft reads one feature row per head. On the CPU, that row times a (H, V) weight streams it several
    times faster than `F.linear` against the (V, H) one, which takes a slower matrix-vector kernel (the
    medusa-63 step's drafting on the tiny target: 4 heads, V = 4096, 1 thread). The copy costs the
    projections' memory once more; on an accelerator the heads' own forward is kept.
    """
    projections = list(heads.lm_heads) if heads.lm_heads is not None else [lm_head]
    if any(getattr(p, "bias", None) is not None for p in projections):
        return None
    weights = [p.weight for p in projections]
    if weights[0].device.type != "cpu":
        return None
    return torch.stack([w.detach().t() for w in weights]).contiguous()


class BatchedMedusaDrafter:
    """A `MedusaDrafter` over B rows: each row's static tree from its own feature before the root.

    MedusaDrafter reads only the root and the feature at the root's predecessor (drafters.py), so it is
    handed a context holding just those, (B, 1) each; it keeps no state across steps.
    """

    def __init__(self, drafter: MedusaDrafter):
        self.drafter = drafter
        self.capture_layers = tuple(drafter.capture_layers)

    @torch.no_grad()
    def propose(self, context: BatchDraftContext) -> DraftTree:
        layer = self.capture_layers[0]
        hidden = context.hidden[layer]  # (B, M, H)
        index = context.last_column().to(hidden.device)[:, None, None].expand(-1, 1, hidden.shape[-1])
        feature = hidden.gather(1, index)  # (B, 1, H) at the root's predecessor
        one = DraftContext(
            tokens=context.roots[:, None],
            hidden={layer: feature},
            step=context.step,
            sampling=context.sampling,
            generator=context.generator,
        )
        return self.drafter.propose(one)

    def select_rows(self, rows: torch.Tensor) -> None:
        pass
