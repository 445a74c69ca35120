"""Calibrated trees (`specheads eval --tree auto`): the acceptance estimates, their replay, the choice, and
the command end to end (test_tree_auto_cli.py). Timings are injected where a choice is checked; none is
asserted."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.decode import (
    DraftTree,
    MedusaDrafter,
    SpeculativeDecoder,
    StaticTree,
    build_tree,
    default_tree,
    new_cache,
)
from specheads.decode.calibrate import (
    MEDUSA_RANKS,
    CalibrationSettings,
    Candidate,
    choose,
    decode_accept_length,
    greedy_sequence,
    medusa_candidates,
    medusa_ranks,
    rank_accuracies,
    static_accept_length,
)
from specheads.decode.calibrate_dynamic import (
    DynamicStep,
    _ValueRecorder,
    dynamic_accept_length,
    dynamic_accept_lengths,
    kept_nodes,
    node_depths,
    record_dynamic_steps,
)
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.evaluate.calibrate import calibrated_drafter, timed
from specheads.evaluate.step_timing import MeasuredTimer, same_work
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, layer_config_from
from specheads.methods import methods
from specheads.train.eagle_losses import eagle_loss

from helpers import FakeTimer, tiny_model

VOCAB = 264


@pytest.fixture(scope="module")
def target() -> FrozenTarget:
    return FrozenTarget(tiny_model("llama", vocab_size=VOCAB))


def medusa_heads(target: FrozenTarget, num_heads: int = 3) -> MedusaHeads:
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=num_heads))
    return heads.init_lm_heads_from(target.lm_head).eval()


def eagle_head(target: FrozenTarget) -> EagleHead:
    torch.manual_seed(0)
    return EagleHead(EagleConfig(layer_config_from(target.config))).eval()


# -- Medusa: acceptance ------------------------------------------------------------------------------------


def test_rank_accuracies_and_replayed_tau_by_hand():
    # one sequence of 7 new tokens: a row per root (the first 6 new tokens); columns: the true token's rank in
    # heads 0 and 1 (2 = not in their top 2; -1 = past the end of the sequence)
    ranks = torch.tensor([[0, 0], [0, 1], [0, 2], [1, 0], [2, 0], [0, 0], [0, -1]])[:6]
    acc = rank_accuracies(torch.cat([ranks, torch.tensor([[1, -1]])]), num_ranks=2)  # the -1 row is left out
    # head 0 over all 6 roots; head 1 over the 5 whose head-0 truth is in the top 2 (not [2, 0])
    torch.testing.assert_close(acc, torch.tensor([[4 / 6, 1 / 6], [3 / 5, 1 / 5]], dtype=torch.float64))
    # the tree {(0,), (0, 0), (1,)} accepts 2, 1, 1, 1 ((1, 0) is not in it), 0, 2 at the six roots. Decoding
    # roots at 0 (emits 3), then at 3 (emits 2), then at 5, where only 1 token is left: τ = 6 / 3, not the
    # mean over every root (1 + 7 / 6)
    assert decode_accept_length([[2, 1, 1, 1, 0, 2]]) == 2.0
    assert static_accept_length([(0,), (0, 0), (1,)], [ranks]) == 2.0
    assert static_accept_length([], [ranks, ranks[:2]]) == 1.0  # the root alone: one token a step
    with pytest.raises(ValueError, match="no step to replay"):
        decode_accept_length([[], []])


class StubHeads(nn.Module):
    """Medusa heads whose logits are set by hand; they check they are fed the target's features at the
    positions medusa_ranks should score."""

    def __init__(self, logits: torch.Tensor, expected_hidden: torch.Tensor):
        super().__init__()
        self.logits, self.expected_hidden = logits, expected_hidden  # (K, P, V), (P, H)
        self.num_heads = logits.shape[0]
        self.config = SimpleNamespace(share_lm_head=False)
        self.weight = nn.Parameter(torch.zeros(1))

    def head(self, k, hidden, lm_head=None):  # fed the first rows: the later ones run past the sequence
        torch.testing.assert_close(hidden, self.expected_hidden[: hidden.shape[0]])
        return self.logits[k, : hidden.shape[0]]


def test_medusa_ranks_score_head_k_at_offset_k_plus_2(target):
    sequence = torch.tensor([[5, 9, 14, 20, 31, 47, 60, 77]])  # a prompt of 3, then 5 new tokens
    prompt_len, num_ranks = 3, 2
    # roots at the first 4 new tokens (positions 3..6): the heads read t = 2..5, head k guesses t + 2 + k
    wanted = [
        [0, 1],
        [2, 0],
        [1, 2],
        [0, -1],
    ]  # rank per (root, head): 2 = outside the top 2, -1 = past the end
    logits = torch.zeros(2, 4, VOCAB)
    for row, t in enumerate((2, 3, 4, 5)):
        for k in range(2):
            if wanted[row][k] < 0:
                continue
            truth = int(sequence[0, t + 2 + k])
            place = wanted[row][k] if wanted[row][k] < num_ranks else 7
            others = [v for v in range(VOCAB) if v != truth]
            order = others[:place] + [truth] + others[place:]  # tokens, most likely first
            logits[k, row, order] = -torch.arange(VOCAB, dtype=torch.float)
    hidden = target(sequence, capture=(-1,), logits=False).hidden[target.layer_id(-1)][0, 2:6]
    (ranks,) = medusa_ranks(target, StubHeads(logits, hidden), [(sequence, prompt_len)], num_ranks)
    assert ranks.tolist() == wanted
    # head 0 over the 3 complete rows; head 1 over the 2 whose head-0 truth is in the top 2 (rank 1, a miss)
    expected = torch.tensor([[1 / 3, 1 / 3], [0.0, 1 / 2]], dtype=torch.float64)
    torch.testing.assert_close(rank_accuracies(ranks, num_ranks), expected)


def test_replayed_tau_is_what_the_decoder_gets(target):
    """The replay walks the calibration prompts as greedy decoding does: its τ is the decoder's, exactly."""
    heads = medusa_heads(target)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (1, 12), generator=g) for _ in range(2)]
    sequences = [(greedy_sequence(target, p, 24), p.shape[1]) for p in prompts]
    ranks = medusa_ranks(target, heads, sequences, MEDUSA_RANKS)
    acc = rank_accuracies(torch.cat(ranks), MEDUSA_RANKS)
    for choices in (
        default_tree("medusa-15", num_heads=3).choices,
        build_tree(acc, 9),
        [(0,), (0, 0), (0, 0, 0)],
    ):
        tree = StaticTree.from_choices(choices)
        decoder = SpeculativeDecoder(target, MedusaDrafter(heads, tree))
        lengths = [n for p in prompts for n in decoder.generate(p, 24).accept_lengths]
        assert static_accept_length(choices, ranks) == pytest.approx(sum(lengths) / len(lengths)), choices
        assert max(lengths) >= 3  # some steps accept two candidates or more: the case has teeth


# -- the choice ----------------------------------------------------------------------------------------------


def candidate(nodes, tau, step, draft=0.0):
    return Candidate(
        {"name": f"n{nodes}", "nodes": nodes, "depth": 1}, tau, step_seconds=step, draft_seconds=draft
    )


def test_choose_takes_the_most_tokens_per_second():
    rows = [candidate(1, 1.0, 1.0), candidate(4, 2.0, 1.5, 0.1), candidate(16, 2.4, 2.0, 0.1)]
    assert [round(c.tokens_per_second, 4) for c in rows] == [1.0, 1.25, round(2.4 / 2.1, 4)]
    assert choose(rows).tree["nodes"] == 4
    assert choose([candidate(8, 2.0, 1.0), candidate(4, 1.0, 0.5)]).tree["nodes"] == 4  # a tie: the smaller
    with pytest.raises(ValueError, match="tried no tree"):
        choose([])


def test_timed_drafts_take_the_fastest_of_those_doing_as_much():
    """A candidate's draft takes the fastest measured among candidates at least as deep and as large (they
    do at least its work); a smaller tree that stops growing early keeps its own, lower time."""

    class Timer:
        def measure(self, nodes, drafters):
            return [n * 1e-3 for n in nodes], [4e-3, 2e-3, 9e-3, 5e-3, 3e-3, 7e-3]

    shapes = [(4, 2), (8, 2), (8, 3), (16, 3), (4, 4), (16, 4)]  # (nodes, depth)
    rows = [Candidate({"name": str(i), "nodes": n, "depth": d}, 2.0) for i, (n, d) in enumerate(shapes)]
    timed(rows, Timer())
    assert [c.step_seconds for c in rows] == [4e-3, 8e-3, 8e-3, 16e-3, 4e-3, 16e-3]
    assert [c.draft_seconds for c in rows] == [2e-3, 2e-3, 5e-3, 5e-3, 3e-3, 7e-3]


def skewed_ranks(roots=400, heads=3, seed=0) -> list[torch.Tensor]:
    """One sequence's ranks of the truth per head: mostly 0, rarely outside the top 4 (4)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.tensor([0.5, 0.2, 0.1, 0.05, 0.15])
    return [torch.multinomial(weights, roots * heads, replacement=True, generator=g).view(roots, heads)]


@pytest.mark.parametrize("cost, picked", [("steep", 1), ("flat", 64)])
def test_medusa_choice_follows_the_timings(target, cost, picked):
    sizes, ranks = (1, 2, 4, 8, 16, 32, 64), skewed_ranks()
    step = (lambda n: 1e-3 * n**2) if cost == "steep" else (lambda n: 1e-3)
    timer = FakeTimer(step)
    candidates = timed(medusa_candidates(medusa_heads(target), target, ranks, 4, sizes), timer)
    taus = [c.accept_length for c in candidates]
    assert taus == sorted(set(taus)), "the case needs τ to grow strictly with the tree"
    # each size N is build_tree's N - 1 best paths, timed at N nodes, drafted over that very tree
    order = build_tree(rank_accuracies(ranks[0], 4), 63)
    canonical = [tuple(sorted(order[: n - 1], key=lambda p: (len(p), p))) for n in sizes]
    assert [c.tree["choices"] for c in candidates] == canonical
    assert timer.nodes == list(sizes) and [d.tree.num_nodes for d in timer.drafters] == list(sizes)
    for c, n in zip(candidates, sizes):
        assert c.tokens_per_second == pytest.approx(c.accept_length / (step(n) + 1e-4))
    best = choose(candidates)
    assert best.tree["nodes"] == picked  # steep: the root alone; flat: the largest tree
    assert best.tokens_per_second == max(c.tokens_per_second for c in candidates)


# -- EAGLE-2: the replay ---------------------------------------------------------------------------------------


def test_dynamic_accept_length_by_hand():
    #   node:    0     1     2     3     4     5        5 under 3 under 1; 4 under 2
    first = DynamicStep(
        values=torch.tensor([0.0, -0.1, -1.0, -0.3, -2.0, -0.5]),
        depths=torch.tensor([0, 1, 1, 2, 2, 3]),
        path=torch.tensor([0, 1, 3, 5]),  # three candidates accepted by the whole tree
    )
    second = DynamicStep(first.values, first.depths, path=torch.tensor([0]))  # none accepted
    assert kept_nodes(first, depth=2, nodes=4).tolist() == [True, True, True, True, False, False]
    roots = [[first, second, second, first]]  # one sequence: 4 roots, 5 new tokens
    # (depth, nodes) -> τ: the walk accepts a at root 0, next at root a + 1, each step cut to what is left
    expected = {
        (3, 6): 4 / 1,  # accepts 3 at root 0: 4 tokens, done
        (2, 4): (3 + 1) / 2,  # node 5 is too deep: accepts 2 (3 tokens), then root 3 has 1 token left
        (3, 3): (3 + 1) / 2,  # keeps nodes 1 and 3
        (3, 2): (2 + 1 + 1) / 3,  # keeps node 1: roots 0, 2, 3
        (1, 6): (2 + 1 + 1) / 3,  # depth 1: nodes 1 and 2
        (3, 1): 1.0,  # the root alone
    }
    for (depth, nodes), tau in expected.items():
        assert dynamic_accept_length(roots, depth, nodes) == pytest.approx(tau), (depth, nodes)


def test_replayed_dynamic_trees_are_the_drafters_own(target):
    """Keeping the N - 1 most valuable nodes no deeper than D of the tree of every candidate gives exactly the
    tree EagleDrafter(depth=D, total_tokens=N) proposes: values are read back right, and the replay holds."""
    head, top_k, depth = eagle_head(target), 3, 3
    everything = top_k + (depth - 1) * top_k**2 + 1
    recorder = _ValueRecorder(EagleDrafter(head, target, top_k=top_k, depth=depth, total_tokens=everything))
    decoder = SpeculativeDecoder(target, recorder)
    prompt = torch.randint(0, 256, (1, 11), generator=torch.Generator().manual_seed(1))
    context = decoder.first_context(prompt, decoder.prefill(prompt, new_cache()))
    full = recorder.propose(context)
    values, depths = recorder.last
    step = DynamicStep(values, depths, path=torch.tensor([0]))
    assert full.num_nodes == everything and values[1:].max() < 0
    for d, n in [(1, 2), (1, 4), (2, 5), (2, 13), (3, 9), (3, 17), (3, everything)]:
        own = EagleDrafter(head, target, top_k=top_k, depth=d, total_tokens=n).propose(context)
        kept = kept_nodes(step, d, n).nonzero().squeeze(1)  # ascending: creation order
        renumber = torch.full((everything,), -1, dtype=torch.long)
        renumber[kept] = torch.arange(kept.numel())
        parents = torch.cat([torch.tensor([-1]), renumber[full.parents[0, kept[1:]]]])
        assert full.tokens[0, kept].tolist() == own.tokens[0].tolist(), (d, n)
        assert parents.tolist() == own.parents[0].tolist(), (d, n)


def test_node_depths_are_the_trees_own():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 40, 265):
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
        tree = DraftTree(tokens=torch.zeros(1, n, dtype=torch.long), parents=parents[None])
        assert torch.equal(node_depths(parents), tree.depths[0]), n


def trained_eagle_head(target: FrozenTarget, prompts: torch.Tensor, steps: int = 60) -> EagleHead:
    """An EAGLE head fitted to the target's greedy continuations of `prompts` (B, T): one that is accepted."""
    sequences = target.model.generate(
        prompts, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    b, t = sequences.shape
    head = eagle_head(target).train()
    out = target(sequences, capture=head.capture_layers)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(steps):
        loss, _ = eagle_loss(
            head,
            out.hidden[target.layer_id(-1)],
            sequences,
            torch.ones(b, t),
            torch.arange(t).expand(b, t),
            out.logits,
            target.embed_tokens,
            target.lm_head,
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def test_replayed_dynamic_tau_is_what_the_decoder_gets(target):
    """Recording only the roots some shape's walk reaches, and verifying only the nodes some shape keeps,
    gives each shape the τ that decoding with its own EagleDrafter gets, exactly."""
    prompts = torch.randint(0, 256, (4, 8), generator=torch.Generator().manual_seed(0))
    head, prompts = trained_eagle_head(target, prompts), list(prompts[:3].split(1))
    shapes = [(1, 2), (1, 4), (2, 4), (2, 8), (3, 8), (3, 16), (3, 32)]
    steps, _ = record_dynamic_steps(target, head, prompts, shapes, top_k=3, depth=3, max_new_tokens=24)
    for (depth, nodes), tau in zip(shapes, dynamic_accept_lengths(steps, shapes)):
        drafter = EagleDrafter(head, target, top_k=3, depth=depth, total_tokens=nodes)
        lengths = [
            n for p in prompts for n in SpeculativeDecoder(target, drafter).generate(p, 24).accept_lengths
        ]
        assert tau == pytest.approx(sum(lengths) / len(lengths)), (depth, nodes)
        assert dynamic_accept_length(steps, depth, nodes) == tau
    assert max(lengths) >= 3  # the deepest trees accept whole paths: the case has teeth
    assert [len(taken) for taken in steps] == [23, 23, 23]  # a root per new token but the last
    assert sum(step is None for taken in steps for step in taken) > 0  # roots no walk reaches: skipped


def test_timer_drafts_once_per_kind_of_work(target):
    """EAGLE-2 drafters of depth 1 draft the same candidates whatever they keep: one of them is timed for all;
    deeper ones may stop growing at a size of their own (`dynamic_tree`, "stop")."""
    head, calls = eagle_head(target), []

    class Counted(EagleDrafter):
        def propose(self, context):
            calls.append((self.depth, self.total_tokens))
            return super().propose(context)

    shapes = [(1, 2), (1, 4), (2, 4), (2, 2)]
    drafters = [Counted(head, target, top_k=3, depth=d, total_tokens=n) for d, n in shapes]
    sequence = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(3))
    timer = MeasuredTimer(target, drafters[0].capture_layers, sequence, start=12, repeats=2)
    seconds = timer.drafts(drafters)
    assert seconds[0] == seconds[1] and sorted(set(calls)) == [(1, 2), (2, 2), (2, 4)]
    assert (
        same_work(drafters[0]) == same_work(drafters[1]) != same_work(drafters[2]) != same_work(drafters[3])
    )


def test_eagle_calibration_with_injected_timings(target):
    head = eagle_head(target)
    prompts = [
        SimpleNamespace(
            id="a", input_ids=torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
        )
    ]
    settings = CalibrationSettings(max_new_tokens=12, sizes=(2, 4, 8, 16), top_k=3, max_depth=2)
    timer = FakeTimer(lambda n: 1e-3)
    drafter, tree, record = calibrated_drafter(
        head, {"method": "eagle"}, target, prompts, settings, timer, methods=methods()
    )
    # depth 1 grows 3 candidates (trees of N <= 4 nodes), depth 2 grows 3 + 9 (N <= 13)
    shapes = [(r["depth"], r["nodes"]) for r in record["candidates"]]
    assert shapes == [(1, 2), (1, 4), (2, 2), (2, 4), (2, 8)]
    assert record["acceptance"]["full_tree_nodes"] == 3 + 9 + 1 and record["acceptance"]["roots"] == 11
    best = max(record["candidates"], key=lambda r: (r["tokens_per_second"], -r["nodes"], -r["depth"]))
    assert tree == record["chosen"] and tree["name"] == best["name"]
    assert (drafter.depth, drafter.total_tokens, drafter.top_k) == (tree["depth"], tree["nodes"], 3)
    assert record["prompts"]["ids"] == ["a"] and record["settings"]["sizes"] == [2, 4, 8, 16]
