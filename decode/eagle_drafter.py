"""EagleDrafter: EAGLE-1/2 and EAGLE-3 heads drafting static (EAGLE-1) or dynamic (EAGLE-2) trees.

The head keeps its own KV cache, one entry per position of the sequence the target has cached:

    entry p   the head's layer over (feature of position p, embedding of x_{p+1}) at rope position p,
              where the feature is the target's own (f_p for EAGLE-1/2, fc(cat(low, mid, high)) for
              EAGLE-3), never one the head predicted.

Each `propose` first brings the cache in step with the target: the decoder's context carries the
target's features at the n positions its last forward added (the prompt after prefill, the accepted
path after a speculative step) and the tokens after them, so the head appends those n entries. Its
output at the last one (position S - 1, whose token is the root x_S) stands for the root's feature and
drafts depth 1.

A tree node at depth d >= 1 is fed as (its parent's output, its token) at position S + d - 1, and
attends to the whole real cache and to its ancestors in the tree; its output drafts depth d + 1. These
are exactly what EAGLE-3's training-time test step d saw (train/eagle_losses.py). Tree entries are
cropped from the cache when the tree is proposed, so only real entries carry over to the next step.

Static trees take Medusa-style tree choices (`decode/trees.py`), read the EAGLE way: path
(r_1, ..., r_d) is the rank-r_d token of the draft's distribution *at its parent node*. Without a static
tree the drafter grows EAGLE-2 dynamic trees (`decode/dynamic_tree.py`). EAGLE-3 drafts over its own
vocabulary; its ids are mapped to target ids with d2t before the target sees them.

When the decoder samples, the tree comes with q at each node that has children (the head's distribution
there at the sampling temperature, mapped to the target's vocabulary). Static trees may then draw each
node's children from q (children="iid" / "without-replacement"; the i-th child takes the i-th draw);
dynamic trees always take the top-k, since EAGLE-2's reranking keeps children by value, which is not a
draw from q.
"""

from __future__ import annotations

import torch
from torch import nn

from specheads.decode.drafters import DraftContext, SampledTree, check_children, sibling_index
from specheads.decode.dynamic_tree import Candidates, candidates_to_tree, grow_candidates, rerank
from specheads.decode.sampling import draft_probs, draw_children
from specheads.decode.trees import DraftTree, StaticTree
from specheads.heads.target import FrozenTarget


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
        """
        if tree is not None and tree.topk > head.draft_vocab_size:
            raise ValueError(
                f"the static tree reads top-{tree.topk} guesses; the draft has {head.draft_vocab_size} tokens"
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
        self.capture_layers = tuple(head.capture_layers)
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        self.cache = None
        self.cached = 0  # real entries in the head's cache (positions 0 .. cached-1)
        self._fed_out = self._fed_ancestors = None  # the tree nodes fed while drafting (see _feed)

    # -- the protocol ------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(self, context: DraftContext) -> DraftTree:
        if context.tokens.shape[0] != 1:
            raise ValueError(
                f"EagleDrafter drafts for one sequence, got a batch of {context.tokens.shape[0]}"
            )
        root_hidden = self.advance(context)  # (1, H): stands for the root's feature
        root = context.tokens[0, -1]
        self._fed_out = root_hidden.new_zeros(0, root_hidden.shape[-1])  # (F, H) outputs of fed nodes
        self._fed_ancestors = torch.zeros(0, 0, dtype=torch.bool, device=root_hidden.device)  # (F, F)
        root_logprobs = self._logprobs(root_hidden)[0]  # (V,) drafts depth 1
        try:
            if self.tree is not None:
                tree, node_logprobs = self._static_tree(root, root_hidden, root_logprobs, context)
            else:
                tree, node_logprobs = self._dynamic_tree(root, root_hidden, root_logprobs)
        finally:
            extra = self.cache.get_seq_length() - self.cached
            if extra > 0:  # drop the tree's entries: only real ones carry over
                self.cache.crop(-extra)
        device = context.tokens.device
        tokens, parents = tree.tokens.to(device), tree.parents.to(device)
        if context.sampling is None:
            return DraftTree(tokens=tokens, parents=parents)
        q = self._tree_draft_probs(tree.num_nodes, node_logprobs, context).to(device)
        children = self.children if self.tree is not None else "top-k"
        return SampledTree(tokens=tokens, parents=parents, draft_probs=q, children=children)

    def _tree_draft_probs(
        self, num_nodes: int, node_logprobs: dict[int, torch.Tensor], context: DraftContext
    ) -> torch.Tensor:
        """(1, N, V_target) q at each node the draft expanded (every node with children; zeros elsewhere)."""
        any_row = node_logprobs[0]
        target_ids = self.head.to_target_ids(torch.arange(any_row.numel(), device=any_row.device))
        q = torch.zeros(1, num_nodes, self.vocab_size, device=any_row.device)
        for node, logprobs in node_logprobs.items():
            q[0, node, target_ids] = draft_probs(logprobs, context.sampling)
        return q

    # -- keeping the head's cache in step with the target ---------------------------------------------

    def advance(self, context: DraftContext) -> torch.Tensor:
        """Append entries for the positions the target's last forward added; (1, H) output at the last.

        With S positions now in the target's cache and n of them new, the new entries are positions
        S - n .. S - 1, reading the target's features there and tokens x_{S-n+1} .. x_S (x_S: the root).
        """
        from transformers import DynamicCache

        weight = self.head.fc.weight
        features = {i: h.to(weight.device, weight.dtype) for i, h in context.hidden.items()}
        hidden = self.head.input_hidden(features)  # (1, n, H)
        n, S = hidden.shape[1], context.tokens.shape[1] - 1
        if context.step == 0 or self.cache is None:
            self.cache, self.cached = DynamicCache(), 0
        if self.cached != S - n:
            raise RuntimeError(
                f"the draft cache holds {self.cached} positions but the target held {S - n} before its "
                f"last forward; pass every step's context to propose (step 0 resets)"
            )
        tokens = context.tokens[:, S - n + 1 :].to(weight.device)  # (1, n) x_{p+1} for each new p
        positions = torch.arange(S - n, S, device=weight.device)[None]  # (1, n)
        causal = positions[0, :, None] >= torch.arange(S, device=weight.device)[None, :]  # (n, S)
        out = self.head(
            hidden, self._embed(tokens), positions, self._additive(causal), self.cache
        )  # (1, n, H)
        self.cached = S
        return out[:, -1]

    # -- tree nodes -----------------------------------------------------------------------------------

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens.to(self.embed_tokens.weight.device)).to(self.head.fc.weight)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """(Q, K) bool -> (1, 1, Q, K) additive mask in the head's dtype."""
        dtype = self.head.fc.weight.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]

    def _logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """(m, H) outputs -> (m, V) log-probabilities over the draft's vocabulary."""
        return self.head.logits(out, self.lm_head).float().log_softmax(-1)

    def _feed(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int, root_hidden: torch.Tensor):
        """Run the head over m tree nodes of one depth; returns their (m, V) log-probabilities.

        Args:
            tokens: (m,) the nodes' target ids.
            parents: (m,) each node's parent among the nodes fed before (index into the fed list), -1
                for the root's children, whose parent output is `root_hidden`.
            depth: the nodes' depth (>= 1): rope position cached + depth - 1.
        """
        fed, m = self._fed_out.shape[0], tokens.numel()
        device = self._fed_out.device
        ancestors = torch.zeros(m, fed + m, dtype=torch.bool, device=device)
        has_parent = parents >= 0
        ancestors[has_parent, :fed] = self._fed_ancestors[parents[has_parent]]
        ancestors[torch.arange(m), fed + torch.arange(m)] = True  # itself
        self._fed_ancestors = torch.cat(
            [torch.nn.functional.pad(self._fed_ancestors, (0, m)), ancestors], dim=0
        )  # (F + m, F + m)
        parent_out = torch.cat([root_hidden, self._fed_out])[parents + 1]  # (m, H); -1 -> the root's
        allowed = torch.cat([torch.ones(m, self.cached, dtype=torch.bool, device=device), ancestors], dim=1)
        positions = torch.full((1, m), self.cached + depth - 1, device=device)
        out = self.head(
            parent_out[None], self._embed(tokens[None]), positions, self._additive(allowed), self.cache
        )
        self._fed_out = torch.cat([self._fed_out, out[0]])
        return self._logprobs(out[0])

    def _static_tree(
        self,
        root: torch.Tensor,
        root_hidden: torch.Tensor,
        root_logprobs: torch.Tensor,
        context: DraftContext,
    ) -> tuple[DraftTree, dict[int, torch.Tensor]]:
        """Fill a static tree level by level: node (.., r) takes the rank-r token at its parent (top-k), or
        its parent's i-th draw from q when it is the parent's i-th child (drawn children).

        Returns the tree and, per node with children, the draft's log-probabilities there.
        """
        tree, device = self.tree, root_hidden.device
        drawn = context.sampling is not None and self.children != "top-k"
        pick = sibling_index(tree.parents) if drawn else tree.ranks  # which of its parent's guesses
        num_children = [tree.parents.count(i) for i in range(tree.num_nodes)]

        def guesses_at(node: int, logprobs: torch.Tensor) -> torch.Tensor:  # draft ids for node's children
            if not drawn:
                return logprobs.topk(tree.topk).indices
            q = draft_probs(logprobs, context.sampling)
            return draw_children(q, num_children[node], self.children == "iid", context.generator)

        node_logprobs = {0: root_logprobs}
        guesses = {0: guesses_at(0, root_logprobs)}  # node -> draft ids of its children's tokens
        fed_index = {0: -1}
        tokens = [root.to(device)]
        for d in range(1, tree.max_depth + 1):
            level = [i for i in range(1, tree.num_nodes) if tree.depths[i] == d]
            for i in level:
                tokens.append(self.head.to_target_ids(guesses[tree.parents[i]][pick[i]]))
            expand = [i for i in level if num_children[i] > 0]
            if expand:
                parents = torch.tensor([fed_index[tree.parents[i]] for i in expand], device=device)
                first = self._fed_out.shape[0]
                logprobs = self._feed(torch.stack([tokens[i] for i in expand]), parents, d, root_hidden)
                for j, i in enumerate(expand):
                    fed_index[i] = first + j
                    node_logprobs[i] = logprobs[j]
                    guesses[i] = guesses_at(i, logprobs[j])
        draft = DraftTree(
            tokens=torch.stack(tokens)[None], parents=torch.tensor(tree.parents, device=device)[None]
        )
        return draft, node_logprobs

    def _dynamic_tree(
        self, root: torch.Tensor, root_hidden: torch.Tensor, root_logprobs: torch.Tensor
    ) -> tuple[DraftTree, dict[int, torch.Tensor]]:
        """EAGLE-2: expand the top-k by cumulative log-probability per depth, rerank to total_tokens.

        Returns the tree and, per node with children, the draft's log-probabilities there.
        """
        fed_index: dict[int, int] = {}  # candidate id -> index among the fed nodes
        fed_logprobs: dict[int, torch.Tensor] = {}  # candidate id -> its (V,) draft log-probabilities

        def expand(candidates: Candidates, ids: torch.Tensor) -> torch.Tensor:
            parent_ids = candidates.parents[ids].tolist()
            parents = torch.tensor([fed_index[p] if p >= 0 else -1 for p in parent_ids], device=ids.device)
            depth = 1 + _depth(candidates.parents, int(ids[0]))
            first = self._fed_out.shape[0]
            logprobs = self._feed(
                self.head.to_target_ids(candidates.tokens[ids]), parents, depth, root_hidden
            )
            fed_index.update({int(c): first + j for j, c in enumerate(ids)})
            fed_logprobs.update({int(c): logprobs[j] for j, c in enumerate(ids)})
            return logprobs

        candidates = grow_candidates(root_logprobs, expand, top_k=self.top_k, depth=self.depth)
        kept = rerank(candidates, self.total_tokens - 1)
        tree = candidates_to_tree(root, candidates, kept, self.head.to_target_ids)
        # node i >= 1 is candidate kept[i-1]; a kept node with kept children was expanded
        node_logprobs = {0: root_logprobs}
        for node, c in enumerate(kept.tolist(), start=1):
            if c in fed_logprobs:
                node_logprobs[node] = fed_logprobs[c]
        return tree, node_logprobs


def _depth(parents: torch.Tensor, node: int) -> int:
    """Depth - 1 of candidate `node` (0 for the root's children), walking its parent pointers."""
    hops = 0
    while int(parents[node]) >= 0:
        node, hops = int(parents[node]), hops + 1
    return hops
