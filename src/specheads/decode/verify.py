"""Verification: which drafted tokens the target confirms, greedy or sampled.

Terms, used the same way throughout `decode/`:

    root           node 0 of a draft tree: the last emitted token, not yet in the KV cache.
    accepted       a candidate node is accepted when the rule below keeps it and every candidate between it
                   and the root; the accepted path runs root .. a*, a* the deepest accepted node.
    p_a            the target's distribution over the token after node a: the argmax (greedy), or the
                   sampling distribution with temperature / top-k / top-p applied as `generate` applies
                   them (sampling.py). The tree forward gives it for every node at once.
    q_a            the draft's distribution at node a, from which a's children were drawn (or ranked).
    residual       what is left of p_a once children of a were rejected (vLLM calls the token drawn from
                   it the "recovered" token).
    bonus token    the token after a*: argmax p_{a*} (greedy), a draw from p_{a*} if a* has no children,
                   or from the residual if all of them were rejected. The tree forward computed the
                   logits there, so every step emits at least one token; it becomes the next tree's root.
    accept length  tokens a step emits: accepted candidates + the bonus token. Its mean over steps is
                   τ (1.0 = plain autoregressive decoding).

Greedy (temperature 0). Let x_i be node i's token, par(i) its parent, and y_i = argmax p_i. Node i is
accepted iff x_j = y_{par(j)} for every candidate j on the path root..i. The step emits x along
root..a* and then y_{a*}: exactly what greedy autoregressive decoding emits next, because each token is
the target's argmax given the very prefix it follows.

Sampling (lossless). The walk starts at the root. At node a with children c_1..c_m (tree order, tokens
x_1..x_m) it runs m rounds on r_1 = p_a: round i accepts c_i with probability α_i; on rejection it
updates r_{i+1} (and q_{i+1}). The first accepted child is the next node; if all are rejected the walk
ends and the bonus is drawn from r_{m+1}. Each rule below makes the token a node emits (its accepted
child's, or the bonus) distributed exactly as p_a, whatever the draft did; the tokens after an accepted
child come from p at that child; so by induction over depth a step samples exactly as autoregressive
decoding from p does (Leviathan et al., 2023; Chen et al., 2023).

(a) deterministic children (top-k: Medusa trees, EAGLE static and EAGLE-2 dynamic trees):
        α_i = r_i(x_i);    r_{i+1} = r_i with x_i zeroed, renormalised.
    This is speculative sampling with the point-mass draft δ_{x_i}: min(1, r(x)/δ_x(x)) = r(x) and
    norm(max(r - δ_x, 0)) = r with x zeroed. EAGLE's `evaluate_posterior` uses it (q = 1).
(b) children drawn from q_a, with the rule that matches how they were drawn:
    i.i.d. (SpecInfer, Miao et al., 2024, multi-step speculative sampling):
        α_i = min(1, r_i(x_i) / q(x_i));    r_{i+1} = norm(max(r_i - q, 0)).
    without replacement (Sequoia, Chen et al., 2024, SWOR verification): q_1 = q_a and
        α_i = min(1, r_i(x_i) / q_i(x_i));  r_{i+1} = norm(max(r_i - q_i, 0));  q_{i+1} = q_i with x_i
        zeroed, renormalised: the law of draw i+1 given the draws before it.
    Why: given the draws so far, x_i ~ q_i, so round i is speculative sampling of r_i from q_i:
        P(emit y) = q_i(y) min(1, r_i(y)/q_i(y)) + (1 - Σ_x min(q_i(x), r_i(x))) r_{i+1}(y) = r_i(y),
    as long as whatever follows a rejection emits r_{i+1}: true of the last round's fallback, and of
    every round before it by induction. Reusing q after a draw without replacement, or p/q on
    deterministic children, breaks this.
(c) Medusa typical acceptance (Cai et al., 2024, §2.3.1), LOSSY: not a sample of p. A candidate is
    accepted when p_par(x) > min(ε, α·exp(-H(p_par))) (H the entropy; Medusa's posterior_threshold
    ε = 0.09 and posterior_alpha α = 0.3); the accepted path is the deepest one whose candidates all
    pass, and the bonus is drawn from p at its end. It trades fidelity for acceptance.
(d) "biased-top-k", WRONG ON PURPOSE, for tests only: rule (b) i.i.d. applied to deterministic top-k
    children, as if a fixed token had been drawn from q. The tests show it does not sample p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specheads.decode.sampling import sample
from specheads.decode.trees import DraftTree


@dataclass
class Acceptance:
    """The outcome of verifying one tree (one batch row).

    path:   (n,) int64 node ids of the accepted path, root first (n - 1 accepted candidates).
    tokens: (n,) int64 new tokens: the accepted candidates' tokens, then the bonus token.
    """

    path: torch.Tensor
    tokens: torch.Tensor

    @property
    def accept_length(self) -> int:
        """Tokens emitted by the step, the bonus token included."""
        return self.tokens.numel()

    @property
    def bonus(self) -> int:
        return int(self.tokens[-1])

    @classmethod
    def walked(cls, path: list[int], tokens: list[int], bonus: int, device: torch.device) -> Acceptance:
        """The outcome of a walk that accepted node ids `path` (root first) of a row whose nodes carry
        `tokens`, then drew or took `bonus`."""
        emitted = [tokens[i] for i in path[1:]] + [bonus]
        return cls(path=_ids(path, device), tokens=_ids(emitted, device))


def _ids(values: list[int], device: torch.device) -> torch.Tensor:
    """A list of ids as an int64 tensor on `device`; through numpy on the CPU, where `torch.tensor(list)`
    costs several times more (7 against 1.3 µs, one thread): it runs twice a step."""
    if device.type == "cpu":
        return torch.from_numpy(np.array(values, dtype=np.int64))
    return torch.tensor(values, dtype=torch.long, device=device)


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance (rule (c), LOSSY): accept x when p(x) > min(threshold, alpha·exp(-H(p)))."""

    threshold: float = 0.09  # ε, Medusa's posterior_threshold
    alpha: float = 0.3  # Medusa's posterior_alpha


# -- greedy -------------------------------------------------------------------------------------------


def verify_greedy(tree: DraftTree, logits: torch.Tensor, walk: bool | None = None) -> list[Acceptance]:
    """Greedy verification of a draft tree against the target's logits over its nodes.

    Args:
        tree: the draft tree, tokens and parents (B, N).
        logits: (B, N, V) the target's logits at each node (from one forward over the tree).
        walk: how: True walks each row from the root, taking the argmax only at the nodes it visits;
            False takes it at every node at once. None: the walk for logits on the CPU, where an argmax
            over the vocabulary costs some 15 max-reductions and each tensor call some microseconds;
            the whole tree at once elsewhere, which waits for the accelerator once per row, not per level.
            Both return the same.

    Returns:
        One Acceptance per batch row: the longest root-to-node path whose tokens all equal the target's
        argmax at their parent (the first such path of that length), and the bonus token (the argmax at
        the path's last node).
    """
    if walk is None:
        walk = logits.device.type == "cpu"
    if not walk:
        return [_greedy_row(tree, logits, b) for b in range(tree.tokens.shape[0])]
    argmax = _row_argmax(logits)
    results = []
    for b in range(tree.tokens.shape[0]):
        tokens, children = tree.tokens[b].tolist(), tree.row_children(b)
        path = [0]
        while True:
            y = argmax(b, path[-1])
            matches = [c for c in children[path[-1]] if tokens[c] == y]
            if len(matches) != 1:
                break
            path.append(matches[0])
        if matches:  # two siblings with the same token: which leads deeper is the whole tree's to say
            results.append(_greedy_row(tree, logits, b))
        else:
            results.append(Acceptance.walked(path, tokens, y, tree.tokens.device))
    return results


def _row_argmax(logits: torch.Tensor) -> Callable[[int, int], int]:
    """(b, node) -> the argmax of logits[b, node] (the first of ties). On the CPU, in a dtype numpy has,
    numpy's: torch's argmax over one row of the vocabulary costs some 15 times numpy's there (13 against
    0.9 µs over 4096 logits, one thread), and the walk takes one per node it visits."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64, torch.float16):
        rows = logits.detach().numpy()
        return lambda b, node: int(rows[b, node].argmax())
    return lambda b, node: int(logits[b, node].argmax())


def _greedy_row(tree: DraftTree, logits: torch.Tensor, b: int) -> Acceptance:
    """Row b's Acceptance from the argmax at every node (the rule as defined)."""
    parents = tree.parents[b : b + 1].clamp(min=0)  # the root's -1 becomes itself, which it always passes
    greedy = logits[b : b + 1].argmax(-1)  # (1, N) y_i
    matches = tree.tokens[b : b + 1] == greedy.gather(1, parents)  # x_i == y_par(i)
    last = _deepest_accepted(tree.ancestors[b : b + 1], tree.depths[b : b + 1], matches)[0]
    path = tree.ancestors[b, last].nonzero().squeeze(-1)  # ascending ids = root .. last
    return Acceptance(path=path, tokens=torch.cat([tree.tokens[b, path[1:]], greedy[0, last].reshape(1)]))


def _deepest_accepted(ancestors: torch.Tensor, depths: torch.Tensor, passes: torch.Tensor) -> torch.Tensor:
    """(B,) the deepest node whose root path passes everywhere (first of ties); `passes` (B, N) per node,
    `ancestors` (B, N, N) and `depths` (B, N) the tree's."""
    passes = passes.clone()
    passes[:, 0] = True  # the root is accepted already
    accepted = ~(ancestors & ~passes[:, None, :]).any(-1)  # (B, N) no failing node on the root path
    return torch.where(accepted, depths, -1).argmax(-1)


# -- sampling: one node (the rules of the module docstring) -------------------------------------------

# coin(α) -> True with probability α. The decoder flips it with a seeded generator; the tests enumerate
# both outcomes with their exact probabilities.
Coin = Callable[[float], bool]
# rule(p (V,), child tokens, q (V,) or None, coin) -> (index of the accepted child, or None; the
# residual r_{m+1} (V,) when none was accepted, else None). p and q are float64.
NodeRule = Callable[
    [torch.Tensor, list[int], torch.Tensor | None, Coin], tuple[int | None, torch.Tensor | None]
]


def accept_deterministic(
    p: torch.Tensor, tokens: list[int], q: torch.Tensor | None, coin: Coin
) -> tuple[int | None, torch.Tensor | None]:
    """Rule (a), deterministic children: α_i = r_i(x_i); on rejection zero x_i and renormalise. q is unused."""
    r = p.clone()
    for i, x in enumerate(tokens):
        if coin(float(r[x])):
            return i, None
        r[x] = 0.0
        r = _normalised(r, fallback=p)
    return None, r


def accept_sampled(
    p: torch.Tensor, tokens: list[int], q: torch.Tensor | None, coin: Coin, *, without_replacement: bool
) -> tuple[int | None, torch.Tensor | None]:
    """Rule (b), children drawn from q: α_i = min(1, r_i(x_i)/q_i(x_i)), r_{i+1} = norm(max(r_i - q_i, 0));
    without replacement, q_{i+1} = q_i with x_i zeroed and renormalised."""
    if q is None and tokens:
        raise ValueError("children drawn from the draft need its distribution q at their parent")
    r = p
    for i, x in enumerate(tokens):
        qx = float(q[x])
        if coin(1.0 if qx <= 0.0 else min(1.0, float(r[x]) / qx)):
            return i, None
        r = _normalised((r - q).clamp(min=0.0), fallback=r)
        if without_replacement:
            q = q.clone()
            q[x] = 0.0
            q = _normalised(q, fallback=q)
    return None, r


def _normalised(r: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """r / Σr; `fallback` when r has no mass left (reached with probability 0, e.g. after r_i = q_i)."""
    total = float(r.sum())
    return r / total if total > 0 else fallback


def _iid(p, tokens, q, coin):
    return accept_sampled(p, tokens, q, coin, without_replacement=False)


def _without_replacement(p, tokens, q, coin):
    return accept_sampled(p, tokens, q, coin, without_replacement=True)


# The rule for each way a drafter picks children (drafters.CHILDREN), plus the biased one for tests.
NODE_RULES: dict[str, NodeRule] = {
    "top-k": accept_deterministic,  # (a)
    "iid": _iid,  # (b) SpecInfer
    "without-replacement": _without_replacement,  # (b) Sequoia
    "biased-top-k": _iid,  # (d) WRONG ON PURPOSE when the children are top-k: tests only
}


# -- sampling: the tree walk --------------------------------------------------------------------------


def verify_sampling(
    tree: DraftTree,
    probs: torch.Tensor,
    generator: torch.Generator,
    rule: str = "top-k",
    draft_probs: torch.Tensor | None = None,
) -> list[Acceptance]:
    """Lossless sampling verification: walk the tree from the root with `rule` at every node.

    Args:
        tree: the draft tree (B, N).
        probs: (B, N, V) p at each node (`sampling_probs` of the tree forward's logits).
        generator: CPU generator for the coins and the bonus draw.
        rule: how the tree's children were picked: "top-k" (deterministic), "iid" or
            "without-replacement" (drawn from q); "biased-top-k" is rule (d), for tests only.
        draft_probs: (B, N, V) q at each node (rows of leaves unused); needed by every rule but "top-k".

    Returns:
        One Acceptance per batch row.
    """
    if rule not in NODE_RULES:
        raise ValueError(f"unknown verification rule {rule!r}; expected one of {sorted(NODE_RULES)}")
    if rule != "top-k" and draft_probs is None:
        raise ValueError(f"rule {rule!r} needs the draft's distributions (draft_probs)")
    node_rule = NODE_RULES[rule]

    def coin(alpha: float) -> bool:
        return float(torch.rand((), dtype=torch.float64, generator=generator)) < alpha

    results, device = [], tree.tokens.device
    for b in range(tree.tokens.shape[0]):
        tokens, children = tree.tokens[b].tolist(), tree.row_children(b)
        path, node = [0], 0
        while True:  # rows of p (and q) are read only for the nodes the walk visits
            p = probs[b, node].to("cpu", torch.float64)
            kids = children[node]
            q = None if rule == "top-k" or not kids else draft_probs[b, node].to("cpu", torch.float64)
            accepted, residual = node_rule(p, [tokens[c] for c in kids], q, coin)
            if accepted is None:
                bonus = sample(residual, generator)
                break
            node = kids[accepted]
            path.append(node)
        results.append(Acceptance.walked(path, tokens, bonus, device))
    return results


# -- typical acceptance (LOSSY) -----------------------------------------------------------------------


def verify_typical(
    tree: DraftTree, probs: torch.Tensor, generator: torch.Generator, typical: TypicalAcceptance
) -> list[Acceptance]:
    """Medusa's typical acceptance, rule (c): NOT lossless (module docstring).

    Args:
        tree: the draft tree (B, N).
        probs: (B, N, V) p at each node.
        generator: CPU generator for the bonus draw.
        typical: ε (threshold) and α.
    """
    entropy = -torch.special.xlogy(probs, probs).sum(-1)  # (B, N) H(p_i)
    cutoff = torch.clamp(typical.alpha * torch.exp(-entropy), max=typical.threshold)  # (B, N)
    parents = tree.parents.clamp(min=0)  # (B, N)
    rows = torch.arange(tree.tokens.shape[0], device=probs.device)[:, None]
    p_token = probs[rows, parents, tree.tokens]  # (B, N) p_{par(i)}(x_i)
    last = _deepest_accepted(tree.ancestors, tree.depths, p_token > cutoff.gather(1, parents))
    results = []
    for b in range(tree.tokens.shape[0]):
        path = tree.ancestors[b, last[b]].nonzero().squeeze(-1)
        bonus = torch.tensor([sample(probs[b, last[b]], generator)], device=tree.tokens.device)
        results.append(Acceptance(path=path, tokens=torch.cat([tree.tokens[b, path[1:]], bonus])))
    return results
