"""BatchedEagleDrafter: EAGLE-1/2 and EAGLE-3 heads drafting for B rows at once, static or dynamic trees.

The batch-1 `EagleDrafter` (eagle_drafter.py) row by row, on one head KV cache laid out like the
target's (batched_inputs.py): head entry p of row b (the head's layer over the target's feature of
position p and the embedding of x_{p+1}, at rope position p) sits in the same slot as the target's key
for position p. So the row's real entries are slots [pad_b, length_b), and the same layout masks both.

Each `propose` first appends the entries for the columns the target's last forward kept (the padded
prompt after prefill, each row's accepted path after a step) and compacts them like the target's
cache; the output at the row's last real column stands for the root's feature and drafts depth 1.
Tree nodes are then fed level by level, B rows at a time: node at depth d of row b at position
root_positions_b + d - 1, seeing the row's real entries and its own ancestors among the fed nodes.
Their entries are cropped before the next step.

Static trees (EAGLE-1): the tree's shape is the same for every row, only its tokens differ. Dynamic
trees (EAGLE-2, dynamic_tree.py): every row expands its own top_k nodes per level, so each level feeds
top_k nodes per row and the rows stay aligned; each row then reranks its candidates to total_tokens
nodes, so every row's tree has the same size and a shape of its own.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import nn

from specheads.decode.batched_inputs import Layout, additive_mask, compact_rows, select_cache_rows
from specheads.decode.dynamic_tree import Candidates, candidates_to_tree, rerank
from specheads.decode.trees import DraftTree, StaticTree
from specheads.heads.target import FrozenTarget

if TYPE_CHECKING:
    from specheads.decode.batched import BatchDraftContext
    from specheads.decode.eagle_drafter import EagleDrafter


class BatchedEagleDrafter:
    """Drafts B trees with an EagleHead or Eagle3Head, keeping the head's batched KV cache in step."""

    def __init__(
        self,
        head: nn.Module,
        target: FrozenTarget,
        tree: StaticTree | None = None,
        *,
        top_k: int = 10,
        depth: int = 6,
        total_tokens: int = 60,
    ):
        """Arguments as `EagleDrafter`: a static tree (EAGLE-1), or None for EAGLE-2 dynamic trees of
        `total_tokens` nodes grown `depth` levels deep expanding `top_k` nodes per level. Of `target`
        only the embedding and lm_head are read (shared with the head)."""
        if tree is not None and tree.topk > head.draft_vocab_size:
            raise ValueError(
                f"the static tree reads top-{tree.topk} guesses; the draft has {head.draft_vocab_size} tokens"
            )
        if tree is None and (top_k < 1 or depth < 1 or total_tokens < 1):
            raise ValueError(
                f"dynamic trees need top_k, depth and total_tokens >= 1, got {top_k}, {depth}, {total_tokens}"
            )
        self.head, self.tree = head.eval(), tree
        self.embed_tokens, self.lm_head = target.embed_tokens, target.lm_head
        self.capture_layers = tuple(head.capture_layers)
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        self.cache = None
        self.cached = 0  # slots of the head's cache that hold real entries' layout (tree entries beyond)
        self._fed_out = self._fed_ancestors = None  # (B, F, H), (B, F, F): the tree nodes fed so far

    @classmethod
    def from_drafter(cls, drafter: EagleDrafter) -> BatchedEagleDrafter:
        """The batched form of a batch-1 EagleDrafter: the same head, tree and dynamic-tree sizes."""
        shared = SimpleNamespace(embed_tokens=drafter.embed_tokens, lm_head=drafter.lm_head)  # the target's
        return cls(
            drafter.head,
            shared,
            drafter.tree,
            top_k=drafter.top_k,
            depth=drafter.depth,
            total_tokens=drafter.total_tokens,
        )

    # -- the protocol ------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(self, context: BatchDraftContext) -> DraftTree:
        root_hidden = self.advance(context)  # (B, H): stands for each root's feature
        b = root_hidden.shape[0]
        self._fed_out = root_hidden.new_zeros(b, 0, root_hidden.shape[-1])
        self._fed_ancestors = torch.zeros(b, 0, 0, dtype=torch.bool, device=root_hidden.device)
        roots = context.roots.to(root_hidden.device)
        root_logprobs = self._logprobs(root_hidden)  # (B, V) drafts depth 1
        try:
            if self.tree is not None:
                tree = self._static_tree(roots, root_hidden, root_logprobs, context.layout)
            else:
                tree = self._dynamic_tree(roots, root_hidden, root_logprobs, context.layout)
        finally:
            extra = self.cache.get_seq_length() - self.cached
            if extra > 0:  # drop the tree's entries: only real ones carry over
                self.cache.crop(-extra)
        device = context.roots.device
        return DraftTree(tokens=tree.tokens.to(device), parents=tree.parents.to(device))

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.cache is not None:
            select_cache_rows(self.cache, rows.to(self.head.fc.weight.device))

    # -- keeping the head's cache in step with the target ---------------------------------------------

    def advance(self, context: BatchDraftContext) -> torch.Tensor:
        """Append and compact the entries for the columns the target's last forward kept; (B, H) output
        at each row's last real column.

        Column i of row b reads the target's feature there and the token after it, at the position of
        slot start_b + i; it sees the row's entries before start_b and the real columns up to itself.
        """
        from transformers import DynamicCache

        weight = self.head.fc.weight
        features = {i: h.to(weight.device, weight.dtype) for i, h in context.hidden.items()}
        hidden = self.head.input_hidden(features)  # (B, M, H)
        if context.step == 0 or self.cache is None:
            self.cache = DynamicCache()
        past = self.cache.get_seq_length()
        pad, length = context.layout.pad.to(weight.device), context.layout.length.to(weight.device)
        start = context.start.to(weight.device)
        if int(start.max()) > past:
            raise RuntimeError(
                f"the draft cache holds {past} slots but a row's entries should reach slot {int(start.max())}; "
                f"pass every step's context to propose (step 0 resets)"
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
        out = self.head(hidden, self._embed(tokens), positions, self._additive(allowed), self.cache)
        self.cached = compact_rows(self.cache, past, columns.expand(b, m), length - start, start)
        last = (length - 1 - start)[:, None, None].expand(-1, 1, out.shape[-1])
        return out.gather(1, last)[:, 0]

    # -- tree nodes -----------------------------------------------------------------------------------

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens.to(self.embed_tokens.weight.device)).to(self.head.fc.weight)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        return additive_mask(allowed, self.head.fc.weight.dtype)

    def _logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H) outputs -> (..., V) log-probabilities over the draft's vocabulary."""
        return self.head.logits(out, self.lm_head).float().log_softmax(-1)

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
        allowed = torch.cat(
            [layout.real_slots(self.cached).to(device)[:, None].expand(b, m, -1), ancestors], -1
        )
        positions = (layout.root_positions.to(device) + depth - 1)[:, None].expand(b, m)
        out = self.head(parent_out, self._embed(tokens), positions, self._additive(allowed), self.cache)
        self._fed_out = torch.cat([self._fed_out, out], dim=1)
        return self._logprobs(out)

    def _static_tree(
        self, roots: torch.Tensor, root_hidden: torch.Tensor, root_logprobs: torch.Tensor, layout: Layout
    ) -> DraftTree:
        """Fill the static tree level by level: node (.., r) takes the rank-r token at its parent."""
        tree, b, device = self.tree, roots.numel(), root_hidden.device
        guesses = {0: root_logprobs.topk(tree.topk, dim=-1).indices}  # node -> (B, topk) draft ids
        fed_index = {0: -1}
        tokens = [roots]
        for d in range(1, tree.max_depth + 1):
            level = [i for i in range(1, tree.num_nodes) if tree.depths[i] == d]
            for i in level:
                tokens.append(self.head.to_target_ids(guesses[tree.parents[i]][:, tree.ranks[i]]))
            expand = [i for i in level if i in tree.parents]  # nodes with children
            if expand:
                parents = torch.tensor([fed_index[tree.parents[i]] for i in expand], device=device)
                first = self._fed_out.shape[1]
                logprobs = self._feed(
                    torch.stack([tokens[i] for i in expand], 1), parents.expand(b, -1), d, root_hidden, layout
                )
                for j, i in enumerate(expand):
                    fed_index[i] = first + j
                    guesses[i] = logprobs[:, j].topk(tree.topk, dim=-1).indices
        parents = torch.tensor(tree.parents, device=device).expand(b, -1)
        return DraftTree(tokens=torch.stack(tokens, 1), parents=parents)

    def _dynamic_tree(
        self, roots: torch.Tensor, root_hidden: torch.Tensor, root_logprobs: torch.Tensor, layout: Layout
    ) -> DraftTree:
        """EAGLE-2 per row (dynamic_tree.grow_candidates, B rows at once), then each row's rerank.

        Candidates are (B, M) tables in creation order, as `Candidates` holds one row's.
        """
        b, device = roots.numel(), root_hidden.device
        k = min(self.top_k, root_logprobs.shape[-1])
        best = root_logprobs.float().topk(k, dim=-1)
        tokens, scores = best.indices, best.values  # (B, k) the root's children
        parents = torch.full((b, k), -1, dtype=torch.long, device=device)
        fed_index = torch.full((b, k), -1, dtype=torch.long, device=device)  # candidate -> fed node
        frontier = torch.arange(k, device=device).expand(b, k)
        for depth in range(1, self.depth):  # the frontier's depth
            frontier_parents = parents.gather(1, frontier)
            parent_fed = torch.where(
                frontier_parents >= 0, fed_index.gather(1, frontier_parents.clamp(min=0)), -1
            )
            first = self._fed_out.shape[1]
            logprobs = self._feed(
                self.head.to_target_ids(tokens.gather(1, frontier)), parent_fed, depth, root_hidden, layout
            )  # (B, k, V)
            fed_index.scatter_(1, frontier, first + torch.arange(k, device=device).expand(b, k))
            children = logprobs.float().topk(k, dim=-1)  # (B, k, k) per frontier node
            child_scores = (scores.gather(1, frontier)[:, :, None] + children.values).reshape(b, -1)
            made = tokens.shape[1]
            tokens = torch.cat([tokens, children.indices.reshape(b, -1)], 1)
            parents = torch.cat([parents, frontier[:, :, None].expand(b, k, k).reshape(b, -1)], 1)
            scores = torch.cat([scores, child_scores], 1)
            fed_index = torch.cat([fed_index, torch.full_like(child_scores, -1, dtype=torch.long)], 1)
            frontier = (made + child_scores.topk(k, dim=-1).indices).sort(-1).values
        trees = []
        for row in range(b):
            candidates = Candidates(tokens=tokens[row], parents=parents[row], scores=scores[row])
            kept = rerank(candidates, self.total_tokens - 1)
            trees.append(candidates_to_tree(roots[row], candidates, kept, self.head.to_target_ids))
        return DraftTree(
            tokens=torch.cat([t.tokens for t in trees]), parents=torch.cat([t.parents for t in trees])
        )
