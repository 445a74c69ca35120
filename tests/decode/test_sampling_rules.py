"""Sampling verification, one node at a time, by exact enumeration: every rule's output law is p.

For each rule the token a node emits (its accepted child's, or the bonus from the residual) is a function
of the children drawn and of the coins the rule flips. Enumerating every draw of the children (with its
probability under q) and every coin outcome (with probability α or 1 - α) gives the exact law of that
token, with no sampling: it must equal p to 1e-12, with temperature, top-k and top-p applied to p. The
biased rule (top-k children checked with p/q) and typical acceptance must not.
"""

import itertools

import pytest
import torch

from specheads.decode.sampling import SamplingParams, draw_children, sampling_probs
from specheads.decode.verify import NODE_RULES

V = 7
SETTINGS = {
    "plain": SamplingParams(),
    "temperature": SamplingParams(temperature=0.6),
    "top-p": SamplingParams(temperature=1.3, top_p=0.8),
    "top-k-top-p": SamplingParams(temperature=0.8, top_k=5, top_p=0.9),
}


def target_p(params: SamplingParams, seed: int = 0) -> torch.Tensor:
    """p over V tokens, several of them likely (top-k / top-p remove the rest)."""
    g = torch.Generator().manual_seed(seed)
    return sampling_probs(torch.randn(V, generator=g), params)


def draft_q(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), -1)


class _Undecided(Exception):
    """The rule flipped a coin past the end of the script."""


class ScriptedCoin:
    """A coin whose outcomes are given in advance; `weight` is the chance of the outcomes so far."""

    def __init__(self, script: tuple[bool, ...]):
        self.flips, self.weight = iter(script), 1.0

    def __call__(self, alpha: float) -> bool:
        outcome = next(self.flips, None)
        if outcome is None:
            raise _Undecided
        self.weight *= alpha if outcome else 1.0 - alpha
        return outcome


def emitted_law(rule, p: torch.Tensor, tokens: list[int], q: torch.Tensor | None) -> torch.Tensor:
    """(V,) the exact law of the token the node emits, enumerating every coin outcome.

    The rule is replayed with scripted coins; a coin past the end of the script stops the replay and
    the script is extended both ways. Each complete script weighs the product of its coins' chances.
    """
    law = torch.zeros(V, dtype=torch.float64)
    scripts = [()]
    while scripts:
        script = scripts.pop()
        coin = ScriptedCoin(script)
        try:
            accepted, residual = rule(p, tokens, q, coin)
        except _Undecided:
            scripts += [(*script, True), (*script, False)]
            continue
        if accepted is None:
            law += coin.weight * residual / residual.sum()
        else:
            law[tokens[accepted]] += coin.weight
    return law


def iid_draws(q: torch.Tensor, m: int):
    """Every ordered m-tuple of i.i.d. draws from q, with its probability."""
    for draw in itertools.product(range(V), repeat=m):
        yield list(draw), float(torch.prod(q[list(draw)]))


def draws_without_replacement(q: torch.Tensor, m: int):
    """Every ordered m-tuple of distinct draws, each from q without the earlier ones, with its probability."""
    for draw in itertools.permutations(range(V), m):
        chance, left = 1.0, 1.0
        for x in draw:
            chance *= float(q[x]) / left
            left -= float(q[x])
        yield list(draw), chance


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize(
    "ranks",  # children as ranks under p: one, three, a repeated token, every token
    [[0], [1, 0, 3], [1, 1, 2], [3, 0, 6, 1, 5, 2, 4]],
    ids=["one", "three", "repeat", "all"],
)
def test_deterministic_children_emit_p(setting, ranks):
    p = target_p(SETTINGS[setting])
    children = p.argsort(descending=True)[ranks].tolist()
    law = emitted_law(NODE_RULES["top-k"], p, children, None)
    torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


def test_deterministic_children_of_removed_tokens_are_never_accepted():
    p = target_p(SETTINGS["top-k-top-p"])
    removed = [int(x) for x in (p == 0).nonzero()]
    assert removed, "top-k / top-p removed no token"
    law = emitted_law(NODE_RULES["top-k"], p, removed[:2], None)
    torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize(
    "rule, draws", [("iid", iid_draws), ("without-replacement", draws_without_replacement)]
)
def test_children_drawn_from_q_emit_p(setting, m, rule, draws):
    p, q = target_p(SETTINGS[setting]), draft_q()
    law = torch.zeros(V, dtype=torch.float64)
    total = 0.0
    for children, chance in draws(q, m):
        law += chance * emitted_law(NODE_RULES[rule], p, children, q)
        total += chance
    assert total == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


def test_q_with_zeros_and_q_equal_to_p():
    """q missing tokens p has (residual carries them), and q == p (every first child accepted)."""
    p = target_p(SETTINGS["plain"])
    sparse = draft_q().clone()
    sparse[[0, 3]] = 0.0
    sparse /= sparse.sum()
    for q in (sparse, p.clone()):
        for rule, draws in (("iid", iid_draws), ("without-replacement", draws_without_replacement)):
            law = sum(
                chance * emitted_law(NODE_RULES[rule], p, c, q) for c, chance in draws(q, 2) if chance > 0
            )
            torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


def test_the_wrong_rule_for_how_children_were_drawn_is_not_p():
    """The residual must match the draws: i.i.d.'s rule on draws without replacement, and the reverse, and
    p/q on top-k children (the biased rule) all give another law."""
    p, q = target_p(SETTINGS["plain"]), draft_q()
    mixed_up = {
        "iid on without-replacement draws": ("iid", draws_without_replacement),
        "without-replacement on iid draws": ("without-replacement", iid_draws),
    }
    for name, (rule, draws) in mixed_up.items():
        law = sum(chance * emitted_law(NODE_RULES[rule], p, c, q) for c, chance in draws(q, 2))
        assert (law - p).abs().max() > 1e-3, name
    top = q.topk(2).indices.tolist()
    biased = emitted_law(NODE_RULES["biased-top-k"], p, top, q)
    assert (biased - p).abs().max() > 1e-2


def test_draw_children_follows_the_law_the_rules_assume():
    """draw_children's ordered draws, i.i.d. and without replacement, against their exact law (chi-square)."""
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    for replacement in (True, False):
        g = torch.Generator().manual_seed(0)
        n = 4000
        counts = torch.zeros(4, 4, dtype=torch.float64)
        for _ in range(n):
            a, b = draw_children(q, 2, replacement, g).tolist()
            counts[a, b] += 1
        if replacement:
            expected = n * q[:, None] * q[None, :]
        else:
            expected = n * q[:, None] * q[None, :] / (1 - q[:, None])
            expected.fill_diagonal_(0)
            assert counts.diagonal().sum() == 0
        cells = expected > 0
        statistic = ((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum()
        dof = torch.tensor((int(cells.sum()) - 1) / 2, dtype=torch.float64)
        assert float(torch.special.gammaincc(dof, statistic / 2)) > 1e-3, replacement
    with pytest.raises(ValueError, match="cannot draw 3 distinct children .* over 2 tokens"):
        draw_children(torch.tensor([0.5, 0.5, 0.0]), 3, False, torch.Generator())
