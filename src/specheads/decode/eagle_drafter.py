"""EagleDrafter: EAGLE-1/2 and EAGLE-3 heads drafting static (EAGLE-1) or dynamic (EAGLE-2) trees, for
one sequence or B rows at once.

The head keeps its own KV cache, laid out like the target's (batched_inputs.py): entry p of a row (the
head's layer over the target's feature of position p and the embedding of x_{p+1}, at rope position p)
sits in the slot of the target's key for position p, so one layout masks both. One sequence is the layout
with one row and no padding (`DraftContext.as_rows`). The feature is the target's own (f_p for
EAGLE-1/2, fc(cat(low, mid, high)) for EAGLE-3), never one the head predicted.

Each `propose` first brings the cache in step with the target: the context carries the target's features
at the columns its last forward kept (the prompt after prefill, each row's accepted path after a step)
and the tokens after them, so the head appends those entries and compacts them like the target's cache.
Its output at a row's last real column (position S - 1, whose token is the root x_S) stands for the
root's feature and drafts depth 1.

A tree node at depth d >= 1 is fed as (its parent's output, its token) at position S + d - 1, and
attends to the row's real entries and to its ancestors in the tree; its output drafts depth d + 1. These
are exactly what EAGLE-3's training-time test step d saw (train/eagle_losses.py). Nodes are fed level by
level, B rows at a time; their entries are cropped when the tree is proposed, so only real entries carry
over to the next step.

Static trees take Medusa-style tree choices (`decode/trees.py`), read the EAGLE way: path
(r_1, ..., r_d) is the rank-r_d token of the draft's distribution *at its parent node*; the shape is the
same for every row. Without a static tree the drafter grows EAGLE-2 dynamic trees
(`dynamic_tree.grow_rows`): every row expands its own top_k nodes per level, then reranks its candidates
to total_tokens nodes, so every row's tree has the same size and a shape of its own. EAGLE-3 drafts over
its own vocabulary; its ids are mapped to target ids with d2t before the target sees them.

When the decoder samples, the tree comes with q at each node that has children (the head's distribution
there at the sampling temperature, mapped to the target's vocabulary). Static trees may then draw each
node's children from q (children="iid" / "without-replacement"; the i-th child takes the i-th draw);
dynamic trees always take the top-k, since EAGLE-2's reranking keeps children by value, which is not a
draw from q.
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.decode.batched_inputs import Layout, compact_rows, select_cache_rows
from specheads.decode.draft_layer import DraftLayer
from specheads.decode.drafters import (
    BatchDraftContext,
    SampledTree,
    check_children,
    check_vocab,
    sibling_index,
)
from specheads.decode.dynamic_tree import Candidates, candidates_to_tree, grow_rows, rerank
from specheads.decode.kv_cache import new_cache
from specheads.decode.sampling import draft_probs, draw_children
from specheads.decode.tree_inputs import additive_mask
from specheads.decode.trees import DraftTree, StaticTree

# EAGLE-2's exact early stop: "1" checks after each level whether the tree is settled and stops growing it,
# "0" grows every level. The tree is the same either way; only the cost differs. The check reads each level's
# values back, a synchronisation on an accelerator. Unset: on for the CPU, where it saves draft forwards, and
# off elsewhere (an H100 in bf16, SmolLM2, dynamic-60: off was faster in 3 of 4 paired runs, 1.10x in the
# geometric mean; benchmarks/records/gpu-h100/2026-11-27-smollm2-bf16-table/)
EARLY_STOP = "SPECHEADS_EAGLE_EARLY_STOP"


def early_stop_for(device: torch.device) -> bool:
    """Whether dynamic trees stop growing once settled on `device` (EARLY_STOP overrides the default)."""
    switch = os.environ.get(EARLY_STOP, "").strip()
    if switch not in ("", "0", "1"):
        raise ValueError(
            f"{EARLY_STOP}={switch!r}: use 1 (stop early), 0 (grow every level) or leave it unset"
        )
    return device.type == "cpu" if switch == "" else switch == "1"


class EagleDrafter:
    """Drafts trees with an EagleHead or Eagle3Head, keeping the head's KV cache in step."""

    def __init__(
        self,
        head: nn.Module,
        target: FrozenTarget,
        tree: StaticTree | None = None,
        *,
        top_k: int = 10,
        depth: int = 6,
        total_tokens: int = 60,
        children: str = "top-k",
        vocab: torch.Tensor | None = None,
    ):
        """
        Args:
            head: `EagleHead` or `Eagle3Head` (eval mode), trained against `target`.
            target: the frozen target; its embedding (and, for EAGLE-1/2, lm_head) is shared.
            tree: a static tree (EAGLE-1); None grows EAGLE-2 dynamic trees.
            top_k, depth, total_tokens: dynamic trees only: children per expanded node and nodes
                expanded per level, tree levels below the root, and nodes including the root.
            children: how children are picked when sampling (drafters.CHILDREN); drawn children need a
                static tree. Greedy decoding always takes the top-k.
            vocab: EAGLE-1/2 only: ascending target ids the draft proposes from (a frequency-ranked draft
                vocabulary, `heads.checkpoint.draft_vocab_ids`); each level then projects onto these rows of
                the lm_head alone. None: the whole vocabulary. The target verifies every draft, so the
                output is the same either way; only which tokens are proposed changes.
        """
        self.early_stop = early_stop_for(target.lm_head.weight.device)
        if vocab is not None and head.method == "eagle3":
            raise ValueError("EAGLE-3 heads draft over their own vocabulary; `vocab` is for EAGLE-1/2 heads")
        self.vocab = check_vocab(vocab, target.vocab_size, target.lm_head.weight.device)
        draft_size = head.draft_vocab_size if vocab is None else vocab.numel()
        if tree is not None and tree.topk > draft_size:
            raise ValueError(
                f"the static tree reads top-{tree.topk} guesses; the draft has {draft_size} tokens"
            )
        if tree is None and (top_k < 1 or depth < 1 or total_tokens < 1):
            raise ValueError(
                f"dynamic trees need top_k, depth and total_tokens >= 1, got {top_k}, {depth}, {total_tokens}"
            )
        if check_children(children) != "top-k" and tree is None:
            raise ValueError(
                f"children={children!r} needs a static tree: EAGLE-2's dynamic trees keep children by value, "
                f"not as draws from the draft"
            )
        self.head, self.tree, self.children = head.eval(), tree, children
        self.vocab_size = target.vocab_size
        self.embed_tokens, self.lm_head = target.embed_tokens, target.lm_head
        # the lm_head's rows of the draft vocabulary, taken once (vocab only) and transposed: a level's
        # few rows times a (H, Vd) right operand run at least as fast as `F.linear` against (Vd, H), and
        # the root's one row 2.4x as fast on the CPU (H = 576, Vd = 8192, 1 thread)
        self._vocab_weight = None
        if self.vocab is not None:
            self._vocab_weight = self.lm_head.weight.detach()[self.vocab].t().contiguous()  # (H, Vd)
        self._vocab_bias = None
        if self.vocab is not None and getattr(self.lm_head, "bias", None) is not None:
            self._vocab_bias = self.lm_head.bias.detach()[self.vocab]
        self.capture_layers = tuple(head.capture_layers)
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        # the head's layer in fewer kernels on the CPU (draft_layer.py); None keeps the head's own forward
        self.draft_layer = DraftLayer.of(head.layer, head.rotary_emb)
        self.cache = None
        # the last dynamic proposal's candidates, with their values (`--tree auto` replays them: calibrate.py)
        self.grown: Candidates | None = None
        self.cached = 0  # slots of the head's cache that hold the rows' real entries (tree entries beyond)
        # while drafting: the tree nodes fed so far, (B, F, H) outputs and (B, F, F) ancestors, and their
        # (B, m, V) log-probabilities per level when sampling (for q)
        self._fed_out = self._fed_ancestors = None
        self._fed_logprobs: list[torch.Tensor] | None = None
        self._real_mask: torch.Tensor | None = None  # additive, over the rows' real entries (_feed)

    @classmethod
    def from_drafter(cls, drafter: EagleDrafter) -> EagleDrafter:
        """A fresh drafter with the same head, tree and sizes, and a cache of its own."""
        fresh = copy.copy(drafter)
        fresh.cache, fresh.cached = None, 0
        return fresh

    def batched(self) -> EagleDrafter:
        """This drafter for batched decoding: afresh, with a cache of its own (it drafts for B rows as it is)."""
        return EagleDrafter.from_drafter(self)

    # -- the protocol ------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(self, context) -> DraftTree:
        """(B, N) trees for a DraftContext (one sequence) or a BatchDraftContext (B rows)."""
        rows = context.as_rows()
        root_hidden = self.advance(rows)  # (B, H): stands for each root's feature
        b, device = root_hidden.shape[0], root_hidden.device
        self._fed_out = root_hidden.new_zeros(b, 0, root_hidden.shape[-1])
        self._fed_ancestors = torch.zeros(b, 0, 0, dtype=torch.bool, device=device)
        self._fed_logprobs = None if rows.sampling is None else []
        self._real_mask = None
        roots = rows.roots.to(device)
        root_logprobs = self._logprobs(root_hidden)  # (B, V) drafts depth 1
        try:
            if self.tree is not None:
                tree, source = self._static_tree(roots, root_hidden, root_logprobs, rows)
            else:
                tree, source = self._dynamic_tree(roots, root_hidden, root_logprobs, rows.layout)
        finally:
            extra = self.cache.get_seq_length() - self.cached
            if extra > 0:  # drop the tree's entries: only real ones carry over
                self.cache.crop(-extra)
        device = rows.roots.device
        tokens, parents = tree.tokens.to(device), tree.parents.to(device)
        if rows.sampling is None:
            return DraftTree(tokens=tokens, parents=parents)
        q = self._tree_draft_probs(root_logprobs, source, rows).to(device)
        children = self.children if self.tree is not None else "top-k"
        return SampledTree(tokens=tokens, parents=parents, draft_probs=q, children=children)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only live rows `rows` (indices into the current rows, in order)."""
        if self.cache is not None:
            select_cache_rows(self.cache, rows.to(self.head.fc.weight.device))

    def _tree_draft_probs(
        self, root_logprobs: torch.Tensor, source: torch.Tensor, rows: BatchDraftContext
    ) -> torch.Tensor:
        """(B, N, V_target) q at each node the draft expanded (every node with children; zeros elsewhere).

        source: (B, N) where each node's log-probabilities are: 0 the root's, 1 + f fed node f's, -1 none.
        """
        logprobs = torch.cat([root_logprobs[:, None], *self._fed_logprobs], dim=1)  # (B, 1 + F, V_draft)
        q_draft = draft_probs(logprobs, rows.sampling)
        at_node = q_draft.gather(1, source.clamp(min=0)[:, :, None].expand(-1, -1, q_draft.shape[-1]))
        target_ids = self.to_target_ids(torch.arange(q_draft.shape[-1], device=q_draft.device))
        q = torch.zeros(*source.shape, self.vocab_size, device=q_draft.device)
        q[:, :, target_ids] = at_node * (source >= 0)[:, :, None]
        return q

    # -- keeping the head's cache in step with the target ---------------------------------------------

    def advance(self, context: BatchDraftContext) -> torch.Tensor:
        """Append and compact the entries for the columns the target's last forward kept; (B, H) output
        at each row's last real column.

        Column i of row b reads the target's feature there and the token after it, at the position of
        slot start_b + i; it sees the row's entries before start_b and the real columns up to itself.
        """
        weight = self.head.fc.weight
        features = {i: h.to(weight.device, weight.dtype) for i, h in context.hidden.items()}
        hidden = self.head.input_hidden(features)  # (B, M, H)
        if context.step == 0 or self.cache is None:
            self.cache = new_cache()
        past = self.cache.get_seq_length()
        pad, length = context.layout.pad.to(weight.device), context.layout.length.to(weight.device)
        start = context.start.to(weight.device)
        if int(start.max()) > past:  # a row's entries would not reach its new columns
            raise RuntimeError(
                f"the draft cache holds {past} positions but the target held {int(start.max())} before its "
                f"last forward; pass every step's context to propose (step 0 resets)"
            )
        b, m = hidden.shape[:2]
        columns = torch.arange(m, device=weight.device)
        slots = start[:, None] + columns  # (B, M)
        real = (slots >= pad[:, None]) & (slots < length[:, None])  # (B, M)
        causal = columns[:, None] >= columns[None, :]  # (M, M)
        block = (causal & real[:, None, :]) | torch.eye(m, dtype=torch.bool, device=weight.device)
        before = Layout(pad=pad, length=start)  # the rows' entries before this block
        allowed = torch.cat([before.real_slots(past)[:, None].expand(b, m, past), block], dim=-1)
        positions = (slots - pad[:, None]).clamp(min=0)
        tokens = context.next_tokens.to(weight.device)
        out = self._head(hidden, self._embed(tokens), positions, self._additive(allowed))
        self.cached = compact_rows(self.cache, past, columns.expand(b, m), length - start, start)
        last = (length - 1 - start)[:, None, None].expand(-1, 1, out.shape[-1])
        return out.gather(1, last)[:, 0]

    # -- tree nodes -----------------------------------------------------------------------------------

    def _head(
        self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The head over (B, m) entries appended to its cache: (B, m, H) outputs."""
        if self.draft_layer is None:
            return self.head(hidden, embeds, positions, mask, self.cache)
        residual, attn_input = self.head.attention_inputs(hidden, embeds)
        return self.draft_layer(residual, attn_input, positions, mask, self.cache)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head.embed(self.embed_tokens, tokens.to(self.embed_tokens.weight.device)).to(
            self.head.fc.weight
        )

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        return additive_mask(allowed, self.head.fc.weight.dtype)

    def _logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H) outputs -> (..., V) log-probabilities over the draft's vocabulary."""
        if self.vocab is not None:
            w = self._vocab_weight
            logits = out.to(w.dtype) @ w
            if self._vocab_bias is not None:
                logits = logits + self._vocab_bias
            return logits.float().log_softmax(-1)
        return self.head.logits(out, self.lm_head).float().log_softmax(-1)

    @property
    def draft_vocab_size(self) -> int:
        """Tokens the draft proposes from: the head's draft vocabulary, or `vocab`."""
        return self.head.draft_vocab_size if self.vocab is None else self.vocab.numel()

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft ids -> target ids (the head's map; with `vocab`, its entries)."""
        if self.vocab is None:
            return self.head.to_target_ids(ids)
        return self.vocab[ids.to(self.vocab.device)].to(ids.device)

    def _feed(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        depth: int,
        root_hidden: torch.Tensor,
        layout: Layout,
    ) -> torch.Tensor:
        """Run the head over m tree nodes per row, all of one depth; their (B, m, V) log-probabilities.

        Args:
            tokens: (B, m) the nodes' target ids.
            parents: (B, m) each node's parent among the nodes fed before (index into the fed list), -1
                for the root's children, whose parent output is `root_hidden` (B, H).
            depth: the nodes' depth (>= 1): position root_positions_b + depth - 1.
        """
        b, fed = self._fed_ancestors.shape[:2]
        m, device = tokens.shape[1], root_hidden.device
        parents = parents.to(device)
        has_parent = (parents >= 0)[:, :, None]  # (B, m, 1)
        inherited = self._fed_ancestors.gather(1, parents.clamp(min=0)[:, :, None].expand(b, m, fed))
        ancestors = torch.cat(
            [inherited & has_parent, torch.eye(m, dtype=torch.bool, device=device).expand(b, m, m)], dim=-1
        )  # (B, m, F + m): the node's fed ancestors and itself
        self._fed_ancestors = torch.cat([nn.functional.pad(self._fed_ancestors, (0, m)), ancestors], dim=1)
        outputs = torch.cat([root_hidden[:, None], self._fed_out], dim=1)  # (B, 1 + F, H)
        index = (parents + 1)[:, :, None].expand(b, m, outputs.shape[-1])
        parent_out = outputs.gather(1, index)  # (B, m, H); -1 -> the root's
        if self._real_mask is None:  # the rows' real entries, the same for every level: (B, 1, 1, cached)
            self._real_mask = self._additive(layout.real_slots(self.cached).to(device)[:, None])
        mask = torch.cat([self._real_mask.expand(b, 1, m, -1), self._additive(ancestors)], dim=-1)
        positions = (layout.root_positions.to(device) + depth - 1)[:, None].expand(b, m)
        out = self._head(parent_out, self._embed(tokens), positions, mask)
        self._fed_out = torch.cat([self._fed_out, out], dim=1)
        logprobs = self._logprobs(out)
        if self._fed_logprobs is not None:
            self._fed_logprobs.append(logprobs)
        return logprobs

    def _static_tree(
        self,
        roots: torch.Tensor,
        root_hidden: torch.Tensor,
        root_logprobs: torch.Tensor,
        context: BatchDraftContext,
    ) -> tuple[DraftTree, torch.Tensor]:
        """Fill the static tree level by level: node (.., r) takes the rank-r token at its parent (top-k), or
        its parent's i-th draw from q when it is the parent's i-th child (drawn children).

        Returns the trees and (B, N) where each node's log-probabilities are (`_tree_draft_probs`).
        """
        tree, b, device = self.tree, roots.numel(), root_hidden.device
        drawn = context.sampling is not None and self.children != "top-k"
        pick = sibling_index(tree.parents) if drawn else tree.ranks  # which of its parent's guesses
        num_children = [tree.parents.count(i) for i in range(tree.num_nodes)]

        def guesses_at(
            node: int, logprobs: torch.Tensor
        ) -> torch.Tensor:  # (B, ·) draft ids for its children
            if not drawn:
                return logprobs.topk(tree.topk, dim=-1).indices
            q = draft_probs(logprobs, context.sampling)
            iid = self.children == "iid"
            return torch.stack(
                [draw_children(q[r], num_children[node], iid, context.generator) for r in range(b)]
            )

        guesses = {0: guesses_at(0, root_logprobs)}  # node -> (B, ·) draft ids of its children's tokens
        fed_index = {0: -1}
        source = [0] + [-1] * (tree.num_nodes - 1)
        tokens = [roots]
        for d in range(1, tree.max_depth + 1):
            level = [i for i in range(1, tree.num_nodes) if tree.depths[i] == d]
            for i in level:
                tokens.append(self.to_target_ids(guesses[tree.parents[i]][:, pick[i]]))
            expand = [i for i in level if num_children[i] > 0]
            if expand:
                parents = torch.tensor([fed_index[tree.parents[i]] for i in expand], device=device)
                first = self._fed_out.shape[1]
                logprobs = self._feed(
                    torch.stack([tokens[i] for i in expand], 1),
                    parents.expand(b, -1),
                    d,
                    root_hidden,
                    context.layout,
                )
                for j, i in enumerate(expand):
                    fed_index[i], source[i] = first + j, 1 + first + j
                    guesses[i] = guesses_at(i, logprobs[:, j])
        parents = torch.tensor(tree.parents, device=device).expand(b, -1)
        draft = DraftTree(tokens=torch.stack(tokens, 1), parents=parents)
        return draft, torch.tensor(source, device=device).expand(b, -1)

    def _dynamic_tree(
        self, roots: torch.Tensor, root_hidden: torch.Tensor, root_logprobs: torch.Tensor, layout: Layout
    ) -> tuple[DraftTree, torch.Tensor]:
        """EAGLE-2 (dynamic_tree.grow_rows, B rows at once), then each row's rerank to total_tokens nodes.

        Returns the trees and (B, N) where each node's log-probabilities are (`_tree_draft_probs`).
        """
        b, device = roots.numel(), root_hidden.device
        fed_of = torch.empty(b, 0, dtype=torch.long, device=device)  # candidate -> fed node, -1 if none

        def expand(candidates: Candidates, frontier: torch.Tensor, depth: int) -> torch.Tensor:
            nonlocal fed_of
            fed_of = nn.functional.pad(fed_of, (0, len(candidates) - fed_of.shape[1]), value=-1)
            frontier_parents = candidates.parents.gather(1, frontier)
            parent_fed = torch.where(
                frontier_parents >= 0, fed_of.gather(1, frontier_parents.clamp(min=0)), -1
            )
            first, k = self._fed_out.shape[1], frontier.shape[1]
            tokens = self.to_target_ids(candidates.tokens.gather(1, frontier))
            logprobs = self._feed(tokens, parent_fed, depth, root_hidden, layout)  # (B, k, V)
            fed_of.scatter_(1, frontier, first + torch.arange(k, device=device).expand(b, k))
            return logprobs

        keep = self.total_tokens - 1 if self.early_stop else None
        candidates = self.grown = grow_rows(
            root_logprobs, expand, top_k=self.top_k, depth=self.depth, keep=keep
        )
        fed_of = nn.functional.pad(fed_of, (0, len(candidates) - fed_of.shape[1]), value=-1)
        trees, sources = [], []
        for r in range(b):
            row = candidates.row(r)
            kept = rerank(row, self.total_tokens - 1)
            trees.append(candidates_to_tree(roots[r], row, kept, self.to_target_ids))
            fed = fed_of[r, kept]  # node i >= 1 is candidate kept[i-1]
            sources.append(torch.cat([fed.new_zeros(1), torch.where(fed >= 0, fed + 1, -1)]))
        draft = DraftTree(
            tokens=torch.cat([t.tokens for t in trees]), parents=torch.cat([t.parents for t in trees])
        )
        return draft, torch.stack(sources)
