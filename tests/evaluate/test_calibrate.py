"""Calibrated trees (`specheads eval --tree auto`): the acceptance estimates, their replay, the choice, and
the command end to end. Timings are injected where a choice is checked; none is asserted."""

import dataclasses
import json
import shlex
import shutil
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from specheads.cli import main as cli
from specheads.decode import (
    DraftTree,
    MedusaDrafter,
    SpeculativeDecoder,
    StaticTree,
    build_tree,
    default_tree,
    new_cache,
)
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.evaluate import calibrate as calibrate_module
from specheads.evaluate import evaluate as evaluate_module
from specheads.evaluate.calibrate import (
    MEDUSA_RANKS,
    CalibrationSettings,
    Candidate,
    calibrated_drafter,
    choose,
    decode_accept_length,
    greedy_sequence,
    holds_out,
    medusa_candidates,
    medusa_ranks,
    rank_accuracies,
    static_accept_length,
    timed,
)
from specheads.evaluate.calibrate_dynamic import (
    DynamicStep,
    _ValueRecorder,
    dynamic_accept_length,
    dynamic_accept_lengths,
    kept_nodes,
    node_depths,
    record_dynamic_steps,
)
from specheads.evaluate.eval_drafters import tree_by_default, trees_for
from specheads.evaluate.step_timing import MeasuredTimer, same_work
from specheads.heads import (
    EagleConfig,
    EagleHead,
    FrozenTarget,
    MedusaConfig,
    MedusaHeads,
    layer_config_from,
    save_heads,
)
from specheads.heads.methods import methods, register
from specheads.train.eagle_losses import eagle_loss

from helpers import tiny_model

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


class FakeTimer:
    """Injected timings: a target step over N nodes costs `step(N)`, every draft 0.1 ms; records what it timed."""

    def __init__(self, step):
        self.step, self.nodes, self.drafters = step, [], []

    def measure(self, nodes, drafters):
        self.nodes, self.drafters = list(nodes), list(drafters)
        return [self.step(n) for n in nodes], [1e-4] * len(drafters)


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


def test_timed_drafts_of_one_depth_share_the_fastest():
    class Timer:
        def measure(self, nodes, drafters):
            return [n * 1e-3 for n in nodes], [4e-3, 2e-3, 9e-3, 5e-3]

    shapes = [(4, 2), (8, 2), (8, 3), (16, 3)]  # (nodes, depth)
    rows = [Candidate({"name": str(i), "nodes": n, "depth": d}, 2.0) for i, (n, d) in enumerate(shapes)]
    timed(rows, Timer())
    assert [c.step_seconds for c in rows] == [4e-3, 8e-3, 8e-3, 16e-3]
    assert [c.draft_seconds for c in rows] == [2e-3, 2e-3, 5e-3, 5e-3]


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
    """EAGLE-2 drafters of one depth grow the same candidates: one of them is timed for all."""
    head, calls = eagle_head(target), []

    class Counted(EagleDrafter):
        def propose(self, context):
            calls.append((self.depth, self.total_tokens))
            return super().propose(context)

    drafters = [Counted(head, target, top_k=3, depth=d, total_tokens=n) for d, n in [(1, 2), (1, 4), (2, 4)]]
    sequence = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(3))
    timer = MeasuredTimer(target, drafters[0].capture_layers, sequence, start=12, repeats=2)
    seconds = timer.drafts(drafters)
    assert seconds[0] == seconds[1] and sorted(set(calls)) == [(1, 2), (2, 4)]
    assert same_work(drafters[0]) == same_work(drafters[1]) != same_work(drafters[2])


def test_eagle_calibration_with_injected_timings(target):
    head = eagle_head(target)
    prompts = [
        SimpleNamespace(
            id="a", input_ids=torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
        )
    ]
    settings = CalibrationSettings(max_new_tokens=12, sizes=(2, 4, 8, 16), top_k=3, max_depth=2)
    timer = FakeTimer(lambda n: 1e-3)
    drafter, tree, record = calibrated_drafter(head, {"method": "eagle"}, target, prompts, settings, timer)
    # depth 1 grows 3 candidates (trees of N <= 4 nodes), depth 2 grows 3 + 9 (N <= 13)
    shapes = [(r["depth"], r["nodes"]) for r in record["candidates"]]
    assert shapes == [(1, 2), (1, 4), (2, 2), (2, 4), (2, 8)]
    assert record["acceptance"]["full_tree_nodes"] == 3 + 9 + 1 and record["acceptance"]["roots"] == 11
    best = max(record["candidates"], key=lambda r: (r["tokens_per_second"], -r["nodes"], -r["depth"]))
    assert tree == record["chosen"] and tree["name"] == best["name"]
    assert (drafter.depth, drafter.total_tokens, drafter.top_k) == (tree["depth"], tree["nodes"], 3)
    assert record["prompts"]["ids"] == ["a"] and record["settings"]["sizes"] == [2, 4, 8, 16]


# -- `specheads eval --tree auto` --------------------------------------------------------------------------------

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about rivers."]},
    {"question_id": 2, "category": "writing", "turns": ["Describe a lighthouse in two lines."]},
    {"question_id": 3, "category": "coding", "turns": ["What does a Python dict do?"]},
]


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("calibrate")
    shutil.copytree(tiny_target_dirs["llama"], root / "target")
    loaded = FrozenTarget.from_pretrained(str(root / "target"))
    save_heads(medusa_heads(loaded), root / "medusa", loaded.record())
    save_heads(eagle_head(loaded), root / "eagle", loaded.record())
    (root / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return {"root": root, "target": root / "target", "questions": root / "questions.jsonl", "loaded": loaded}


def eval_args(setup, out, heads="medusa", *extra):
    return [
        "eval", "--target", str(setup["target"]), "--heads", str(setup["root"] / heads),
        "--prompts", str(setup["questions"]), "--out", str(out), "--max-new-tokens", "12", "--warmup", "0",
        "--no-progress", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("heads", ["medusa", "eagle"])
def test_eval_tree_auto_end_to_end(setup, tmp_path, heads):
    out = tmp_path / "out"
    assert cli(eval_args(setup, out, heads, "--tree", "auto", "--calibration-prompts", "1")) == 0
    results = json.loads((out / "results.json").read_text())
    calibration = results["calibration"]

    # the last question calibrates; the others are evaluated, greedily identical to generate()
    assert calibration["prompts"]["ids"] == ["3"] and [r["id"] for r in results["per_prompt"]] == ["1", "2"]
    assert results["identical_to_baseline"] == "2/2"
    assert results["tree"] == calibration["chosen"] and results["tree"]["name"].startswith("auto-")
    rows = calibration["candidates"]
    assert calibration["settings"]["sizes"] == list(CalibrationSettings().sizes)
    for r in rows:
        assert r["tokens_per_second"] == pytest.approx(
            r["accept_length"] / (r["step_seconds"] + r["draft_seconds"])
        )
        assert 1.0 <= r["accept_length"] <= r["depth"] + 1 and r["step_seconds"] > 0
    best = max(rows, key=lambda r: (r["tokens_per_second"], -r["nodes"], -r["depth"]))
    assert best["name"] == results["tree"]["name"] and best["nodes"] == results["tree"]["nodes"]
    assert len(results["accept_rate_per_depth"]) == results["tree"]["depth"]
    if heads == "medusa":
        assert [r["nodes"] for r in rows] == list(CalibrationSettings().sizes)
        per_head_rank = calibration["acceptance"]["per_head_rank"]
        assert len(per_head_rank) == 3 and all(
            len(row) == 10 and sum(row) <= 1 + 1e-9 for row in per_head_rank
        )
    assert calibration["timing"]["cache_length"] > 0
    report = (out / "report.md").read_text()
    assert f"tree `{results['tree']['name']}` chosen by `--tree auto`" in report
    # the command reproduces the run: it calibrates again rather than naming the chosen tree
    command = shlex.split(results["command"])
    assert command[command.index("--tree") + 1] == "auto" and "--calibration-prompts" in command


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--calibration-prompts", "2"], "--calibration-prompts must be >= 1, with --tree auto"),
        (["--tree", "auto", "--calibration-prompts", "0"], "--calibration-prompts must be >= 1"),
        (["--tree", "auto", "--batch-size", "2"], "not with --batch-size > 1"),
        (["--tree", "auto", "--temperature", "0.7"], "or --temperature > 0"),
        (
            ["--tree", "auto", "--calibration-prompts", "3"],
            "gives 3: at least one must be calibrated and one",
        ),
    ],
)
def test_tree_auto_errors_before_any_work(setup, tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        cli(eval_args(setup, tmp_path / "out", "medusa", *extra))
    assert not (tmp_path / "out").exists()


# -- stopped and resumed: the calibrated tree is kept, not measured again -----------------------------------


def timings_favouring(monkeypatch, largest: bool) -> FakeTimer:
    """Calibrations from now on time a step over N nodes so that the largest tree wins (`largest`), or the
    smallest: two timings of one machine that choose different trees."""
    fake = FakeTimer((lambda n: 1e-3 / n) if largest else (lambda n: 1e-3 * n))
    monkeypatch.setattr(calibrate_module, "measured_timer", lambda *args: fake)
    return fake


@pytest.mark.parametrize("heads", ["medusa", "eagle"])
def test_a_stopped_tree_auto_eval_resumes_with_its_calibrated_tree(
    setup, tmp_path, monkeypatch, capsys, heads
):
    args = ["--tree", "auto", "--calibration-prompts", "1"]
    whole = tmp_path / "whole"
    timings_favouring(monkeypatch, largest=True)
    assert cli(eval_args(setup, whole, heads, *args)) == 0
    reference = json.loads((whole / "results.json").read_text())
    assert reference["tree"]["nodes"] > 2  # a second calibration, timed as below, chooses another tree

    out = tmp_path / "stopped"
    real, calls = evaluate_module.decode_prompt, []

    def stopping(*a, **k):  # the second evaluated prompt is stopped
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(evaluate_module, "decode_prompt", stopping)
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, heads, *args))
    assert "stopped after 1 of 2 prompts" in capsys.readouterr().out
    header = json.loads((out / "progress.jsonl").read_text().splitlines()[0])
    assert header["settings"]["tree"] == "auto" and header["settings"]["calibration_prompts"] == ["3"]
    assert header["kept"]["calibration"]["chosen"] == reference["tree"]

    monkeypatch.undo()
    second = timings_favouring(monkeypatch, largest=False)
    assert cli(eval_args(setup, out, heads, *args, "--resume")) == 0
    assert second.nodes == []  # nothing was timed again
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["tree"] == reference["tree"]
    calibrations = [
        {k: v for k, v in r["calibration"].items() if k != "seconds"} for r in (resumed, reference)
    ]
    assert calibrations[0] == calibrations[1]  # measured once, by the first part
    timings = {"seconds", "baseline_seconds"}
    assert [{k: v for k, v in r.items() if k not in timings} for r in resumed["per_prompt"]] == [
        {k: v for k, v in r.items() if k not in timings} for r in reference["per_prompt"]
    ]
    for key in (
        "new_tokens",
        "steps",
        "mean_accept_length",
        "accept_rate_per_depth",
        "identical_to_baseline",
    ):
        assert resumed[key] == reference[key]


# -- the default tree: the method's `default_tree`, auto only where the run can calibrate ----------------------


@pytest.fixture
def eagle_calibrates_by_default():
    """EAGLE's entry with default_tree "auto" for the test (the built-in entries keep their fixed trees)."""
    entry = methods()["eagle"]
    register(dataclasses.replace(entry, default_tree="auto"), replace=True)
    yield
    register(entry, replace=True)


def test_tree_by_default_only_where_the_run_can_calibrate(eagle_calibrates_by_default):
    assert tree_by_default("eagle", calibrates=True) == "auto"
    assert tree_by_default("eagle", calibrates=False) is None  # sampling, batches: the fixed default
    assert tree_by_default("medusa", calibrates=True) is None and tree_by_default("hydra", True) is None
    assert trees_for(None, ["medusa", "eagle"], calibrates=True) == [None, "auto"]
    assert trees_for(["chain-4"], ["medusa", "eagle"], calibrates=True) == ["chain-4", "chain-4"]  # named
    assert holds_out(5, None, None) and not holds_out(4, None, None)  # 4 held out by default, 1 evaluated
    assert holds_out(6, 2, 4) and not holds_out(6, 2, 5)


SIX = QUESTIONS + [
    {"question_id": 4, "category": "coding", "turns": ["What is a list comprehension?"]},
    {"question_id": 5, "category": "writing", "turns": ["Name three rivers."]},
    {"question_id": 6, "category": "coding", "turns": ["Why use a set?"]},
]


def test_eval_takes_the_default_tree_and_a_named_one_over_it(setup, tmp_path, eagle_calibrates_by_default):
    questions = tmp_path / "six.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in SIX))

    def results(out, *extra):
        args = eval_args(setup, tmp_path / out, "eagle", *extra)
        args[args.index("--prompts") + 1] = str(questions)
        assert cli(args) == 0
        return json.loads((tmp_path / out / "results.json").read_text())

    # no --tree: calibrated on the last 4 prompts, the others evaluated; recorded as `--tree auto` records it
    auto = results("auto")
    assert auto["tree"] == auto["calibration"]["chosen"] and auto["tree"]["name"].startswith("auto-")
    assert auto["calibration"]["prompts"]["ids"] == ["3", "4", "5", "6"]
    assert [r["id"] for r in auto["per_prompt"]] == ["1", "2"] and auto["identical_to_baseline"] == "2/2"
    command = shlex.split(auto["command"])
    assert command[command.index("--tree") + 1] == "auto"
    # --calibration-prompts without --tree: the default calibrates on that many
    assert results("one", "--calibration-prompts", "1")["calibration"]["prompts"]["ids"] == ["6"]
    # a named tree wins over the default; too few prompts to hold 4 out and evaluate 3, or sampling: the
    # fixed default. Nothing is held out: the first prompts are evaluated
    for out, extra, tree in [
        ("named", ["--tree", "dynamic-12", "--num-prompts", "3"], "dynamic-12"),
        ("few", ["--num-prompts", "3"], "dynamic-32"),
        ("sampled", ["--temperature", "0.7", "--num-prompts", "2"], "dynamic-32"),
    ]:
        fixed = results(out, *extra)
        assert fixed["tree"]["name"] == tree and "calibration" not in fixed, out
        assert [r["id"] for r in fixed["per_prompt"]] == ["1", "2", "3"][: 2 if out == "sampled" else 3], out


def test_compare_takes_each_heads_default_tree(setup, tmp_path, eagle_calibrates_by_default):
    questions = tmp_path / "six.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in SIX))
    out = tmp_path / "out"
    args = ["compare", "--target", str(setup["target"]), "--prompts", str(questions), "--out", str(out)]
    args += ["--heads", str(setup["root"] / "medusa"), str(setup["root"] / "eagle"), "--peers", "generate"]
    args += ["--max-new-tokens", "12", "--warmup", "0", "--no-plots", "--no-progress"]
    assert cli(args) == 0
    results = json.loads((out / "results.json").read_text())
    medusa, eagle = (m["settings"] for m in results["methods"][1:])
    assert medusa["tree"]["name"] == "medusa-31" and "calibration" not in medusa  # Medusa's fixed default
    assert eagle["tree"] == eagle["calibration"]["chosen"] and eagle["tree"]["name"].startswith("auto-")
    assert results["prompts"]["calibration"] == ["3", "4", "5", "6"] and len(results["order"]) == 2
    assert "--tree" not in shlex.split(results["command"])  # the same defaults reproduce it


def test_calibration_prompts_without_tree_need_a_default_auto(setup, tmp_path):
    """Medusa's default tree is fixed: --calibration-prompts without --tree is refused, as with a named tree."""
    with pytest.raises(ValueError, match="--calibration-prompts must be >= 1, with --tree auto"):
        cli(eval_args(setup, tmp_path / "eval", "medusa", "--calibration-prompts", "1"))
    args = ["compare", "--target", str(setup["target"]), "--prompts", str(setup["questions"]), "--out"]
    args += [str(tmp_path / "compare"), "--heads", str(setup["root"] / "medusa"), "--peers", "generate"]
    with pytest.raises(ValueError, match="no heads directory's default tree is auto"):
        cli([*args, "--calibration-prompts", "1", "--no-plots"])
