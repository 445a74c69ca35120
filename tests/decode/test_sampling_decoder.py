"""Sampled speculative decoding reproduces the target's own sampling: the joint law of the first three new
tokens drawn by the whole decoder passes a chi-square test against the exact joint (brute force over every
prefix), for Medusa and EAGLE-2 dynamic trees, at temperature 1 and with temperature / top-k / top-p; the
biased rule (top-k children checked with p/q) fails the same test; a seed reproduces a run.

The target is a tiny Llama with a 16-token vocabulary (so the joint has 16³ cells) whose lm_head is scaled
up so that p is peaked enough for drafted children to be accepted often.
"""

import copy
from collections import Counter
from dataclasses import dataclass, replace

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.decode import (
    MedusaDrafter,
    SpeculativeDecoder,
    StaticTree,
    compact_cache,
    new_cache,
    tree_inputs,
)
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import left_pad
from specheads.decode.decoder import SamplingOptions
from specheads.decode.drafters import DraftContext
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.sampling import SamplingParams, sampling_probs
from specheads.decode.verify import verify_sampling
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, llama_layer_config_from

from helpers import tiny_model

VOCAB, PROMPT, NEW = 16, [3, 9, 4, 12, 7], 3
MEDUSA_TREE = StaticTree.from_choices([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0)])
SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.8-k6-p0.8": SamplingParams(temperature=0.8, top_k=6, top_p=0.8),
}


@pytest.fixture(scope="module")
def target() -> FrozenTarget:
    model = tiny_model("llama", vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits ~ N(0, 3²): p peaked, not one-hot
    return FrozenTarget(model)


def medusa(target: FrozenTarget) -> MedusaDrafter:
    """Fresh Medusa heads: identity blocks and the target's lm_head, i.e. nudged toward the target."""
    heads = MedusaHeads(MedusaConfig(target.hidden_size, VOCAB, num_heads=3))
    return MedusaDrafter(heads.init_lm_heads_from(target.lm_head).eval(), MEDUSA_TREE)


def eagle(target: FrozenTarget) -> EagleDrafter:
    """A random EAGLE head with the engines' Llama draft layer (`draft_arch: llama`, what runs train),
    sized from the target whatever its family."""
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(llama_layer_config_from(target.config), draft_arch="llama")).eval()
    return EagleDrafter(head, target, top_k=6, depth=3, total_tokens=16)


DRAFTERS = {"medusa": medusa, "eagle-dynamic": eagle}


# -- the exact joint ----------------------------------------------------------------------------------


@torch.no_grad()
def exact_joint(target: FrozenTarget, params: SamplingParams) -> torch.Tensor:
    """(V, V, V) P(t1, t2, t3 | prompt) under p, from one batched forward over every prefix prompt+t1+t2."""
    T = len(PROMPT)
    t1, t2 = torch.meshgrid(torch.arange(VOCAB), torch.arange(VOCAB), indexing="ij")
    seqs = torch.cat([torch.tensor(PROMPT).expand(VOCAB * VOCAB, T), t1.reshape(-1, 1), t2.reshape(-1, 1)], 1)
    logits = target.model(seqs).logits.view(VOCAB, VOCAB, T + 2, VOCAB)
    p1 = sampling_probs(logits[0, 0, T - 1], params)  # (V,)
    p2 = sampling_probs(logits[:, 0, T], params)  # (V, V) [t1, t2]
    p3 = sampling_probs(logits[:, :, T + 1], params)  # (V, V, V) [t1, t2, t3]
    if params.top_p < 1.0:  # tree and plain forwards differ by ~1e-6: keep clear of top-p's boundary
        cumulative = torch.cat([p.reshape(-1, VOCAB) for p in (p1, p2, p3)]).sort(-1).values.cumsum(-1)
        margin = (cumulative - (1 - params.top_p)).abs().min()
        assert margin > 1e-5, f"a context sits {margin:.1e} from the top-p boundary: pick another prompt"
    return p1[:, None, None] * p2[:, :, None] * p3


def chi_square_p_value(counts: Counter, joint: torch.Tensor) -> float:
    """Pearson's test of the sampled 3-token prefixes against `joint`; cells expected < 5 times are pooled.

    A prefix the joint gives probability 0 (a token top-k / top-p removed) fails outright.
    """
    n = sum(counts.values())
    observed = torch.zeros(joint.numel(), dtype=torch.float64)
    for (a, b, c), k in counts.items():
        observed[(a * VOCAB + b) * VOCAB + c] = k
    expected = n * joint.reshape(-1)
    if observed[expected == 0].sum() > 0:
        return 0.0
    small, large = (expected > 0) & (expected < 5), expected >= 5
    if small.any():
        observed = torch.cat([observed[large], observed[small].sum()[None]])
        expected = torch.cat([expected[large], expected[small].sum()[None]])
    else:
        observed, expected = observed[large], expected[large]
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor((observed.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))


# -- sampling the decoder many times ------------------------------------------------------------------


@dataclass
class Scored:
    """A step's deterministic part at one prefix: the context, the tree, the target over it, the caches."""

    context: DraftContext
    tree: object
    out: object
    cache: object  # the target's cache after the tree forward (past_len + N)
    past_len: int
    drafter: object  # the drafter as the step left it (its own cache, for EAGLE)


class PrefixSampler:
    """Draws the first new tokens of `decoder.generate(prompt, do_sample=True, ...)` many times.

    It chains the decoder's own verbs as `generate` and `step` do (prefill, first_context, propose,
    tree_inputs, tree_forward, verify, compact_cache, next_context: `test_prefix_sampler_is_generate`
    checks it draws exactly what generate draws for the same seed), but runs the deterministic part of a
    step, the draft and the tree forward, once per prefix: with top-k children the tree at a prefix never
    changes, and only verification draws. That makes thousands of samples affordable.
    """

    def __init__(self, decoder: SpeculativeDecoder, params: SamplingParams):
        self.decoder, self.params = decoder, params
        self.prompt = torch.tensor([PROMPT])
        self.cache = new_cache()
        self.prefilled = decoder.prefill(self.prompt, self.cache)
        self.fresh_drafter = copy.deepcopy(decoder.drafter)
        self.scored: dict[tuple, Scored] = {}
        self.accept_lengths: list[int] = []

    def sample(self, generator: torch.Generator, verify=None) -> tuple[int, ...]:
        verify = verify or self.decoder.verify
        settings = SamplingOptions(True, **self.params.to_dict(), generator=generator).context_fields()
        context = self.decoder.first_context(self.prompt, self.prefilled, **settings)
        new = [context.tokens[0, -1].item()]
        key = ("first", new[0])
        if key not in self.scored:
            self._score(key, context, copy.deepcopy(self.cache), self.fresh_drafter)
        state = self.scored[key]
        while len(new) < NEW:
            context = replace(state.context, generator=generator)
            acceptance = verify(state.tree, state.out.logits, context)
            self.accept_lengths.append(acceptance.accept_length)
            new += acceptance.tokens.tolist()
            if len(new) < NEW:
                key = (key, tuple(acceptance.tokens.tolist()))
                if key not in self.scored:
                    cache = copy.deepcopy(state.cache)
                    compact_cache(cache, state.past_len, acceptance.path)
                    after = self.decoder.next_context(state.context, acceptance, state.out)
                    self._score(key, after, cache, state.drafter)
                state = self.scored[key]
        return tuple(new[:NEW])

    def _score(self, key, context: DraftContext, cache, drafter) -> None:
        """Propose and run the tree forward at a new prefix, from the drafter as it stood before."""
        self.decoder.drafter = copy.deepcopy(drafter)  # as generate would hold it at this prefix
        past_len = cache.get_seq_length()
        tree = self.decoder.drafter.propose(context)
        inputs = tree_inputs(tree, past_len, self.decoder.mask_dtype, self.decoder.window)
        out = self.decoder.tree_forward(tree, inputs, cache)
        self.scored[key] = Scored(context, tree, out, cache, past_len, self.decoder.drafter)


def biased_verify(tree, logits, context):
    """SpeculativeDecoder.verify with rule (d): the tree's top-k children checked with min(1, p/q)."""
    probs = sampling_probs(logits, context.sampling)
    return verify_sampling(tree, probs, context.generator, "biased-top-k", tree.draft_probs)[0]


def sample_prefixes(target, drafter_name, params, num_samples, seed=0, verify=None):
    """Counts of the first NEW tokens over `num_samples` runs, and every step's accept length."""
    sampler = PrefixSampler(SpeculativeDecoder(target, DRAFTERS[drafter_name](target)), params)
    generator = torch.Generator().manual_seed(seed)
    counts = Counter(sampler.sample(generator, verify) for _ in range(num_samples))
    return counts, sampler.accept_lengths


# -- the tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter_name", sorted(DRAFTERS))
def test_prefix_sampler_is_generate(target, drafter_name):
    """Same seed, same tokens: the sampler is the decoder's own generate, draw for draw."""
    decoder = SpeculativeDecoder(target, DRAFTERS[drafter_name](target))
    params = SETTINGS["t0.8-k6-p0.8"]
    sampler = PrefixSampler(SpeculativeDecoder(target, DRAFTERS[drafter_name](target)), params)
    for seed in range(6):
        drawn = sampler.sample(torch.Generator().manual_seed(seed))
        out = decoder.generate(
            torch.tensor([PROMPT]),
            NEW,
            eos_token_id=[],
            do_sample=True,
            **params.to_dict(),
            generator=torch.Generator().manual_seed(seed),
        )
        assert out.tokens[0].tolist() == list(drawn), seed


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("drafter_name", sorted(DRAFTERS))
def test_sampled_prefixes_follow_the_target(target, drafter_name, setting):
    params = SETTINGS[setting]
    counts, accept_lengths = sample_prefixes(target, drafter_name, params, num_samples=3000)
    p_value = chi_square_p_value(counts, exact_joint(target, params))
    accepted = sum(n > 1 for n in accept_lengths) / len(accept_lengths)
    assert accepted > 0.1, f"drafted tokens were accepted in only {accepted:.0%} of steps"
    assert p_value > 1e-3, (drafter_name, setting, p_value)


def test_biased_rule_fails_the_same_test(target):
    """Top-k children checked with min(1, p/q), as if drawn from q: the prefixes no longer follow p."""
    params = SETTINGS["t1"]
    counts, accept_lengths = sample_prefixes(target, "medusa", params, num_samples=1000, verify=biased_verify)
    assert sum(n > 1 for n in accept_lengths) > 0
    assert chi_square_p_value(counts, exact_joint(target, params)) < 1e-3


def test_a_seed_reproduces_a_run(target):
    for name in DRAFTERS:
        decoder = SpeculativeDecoder(target, DRAFTERS[name](target))
        runs = [
            decoder.generate(
                torch.tensor([PROMPT]),
                24,
                eos_token_id=[],
                do_sample=True,
                top_p=0.9,
                generator=torch.Generator().manual_seed(7),
            )
            for _ in range(2)
        ]
        assert (
            torch.equal(runs[0].tokens, runs[1].tokens) and runs[0].accept_lengths == runs[1].accept_lengths
        )
        other = decoder.generate(
            torch.tensor([PROMPT]),
            24,
            eos_token_id=[],
            do_sample=True,
            top_p=0.9,
            generator=torch.Generator().manual_seed(8),
        )
        assert not torch.equal(other.tokens, runs[0].tokens)  # the seed matters


def test_typical_acceptance_runs_and_the_arguments_are_checked(target):
    decoder = SpeculativeDecoder(target, medusa(target))
    prompt = torch.tensor([PROMPT])
    out = decoder.generate(prompt, 20, eos_token_id=[], do_sample=True, acceptance="typical")
    assert out.tokens.shape[1] == 20 and max(out.accept_lengths) > 1
    with pytest.raises(ValueError, match="typical acceptance is a sampling rule: pass do_sample=True"):
        decoder.generate(prompt, 4, acceptance="typical")
    with pytest.raises(ValueError, match="acceptance='lossy': expected 'exact', 'typical'"):
        decoder.generate(prompt, 4, do_sample=True, acceptance="lossy")
    with pytest.raises(ValueError, match="temperature 0 is greedy decoding"):
        decoder.generate(prompt, 4, do_sample=True, temperature=0.0)
    with pytest.raises(
        TypeError,
        match=r"unexpected keyword argument\(s\) 'temprature'; its sampling keywords are "
        r"do_sample, temperature, top_k, top_p, generator, acceptance",
    ):
        decoder.generate(prompt, 4, do_sample=True, temprature=0.5)


# -- batched sampling: the same verification, row by row ----------------------------------------------

OTHER = [5, 2, 8, 3, 9, 4, 12, 7]  # a longer prompt: the PROMPT rows are left-padded beside it


def medusa_iid(target: FrozenTarget) -> MedusaDrafter:
    """Medusa heads whose children are drawn i.i.d. from q: each row's tree comes with its own q."""
    drafter = medusa(target)
    return MedusaDrafter(drafter.heads, MEDUSA_TREE, children="iid")


BATCHED = {**DRAFTERS, "medusa-iid": medusa_iid}


def sample_batched(target, drafter_name, params, num_samples, rows=500, seed=0):
    """Counts of the first NEW tokens of the PROMPT rows of batches of `rows` rows (PROMPT and OTHER
    alternating, so PROMPT rows are padded), and every PROMPT row's step accept lengths."""
    decoder = BatchedSpeculativeDecoder(target, BATCHED[drafter_name](target))
    generator = torch.Generator().manual_seed(seed)
    ids, mask = left_pad([torch.tensor(PROMPT if r % 2 == 0 else OTHER) for r in range(rows)], 2)
    counts, accept_lengths = Counter(), []
    while sum(counts.values()) < num_samples:
        out = decoder.generate(
            ids, mask, NEW, eos_token_id=[], do_sample=True, **params.to_dict(), generator=generator
        )
        for row in out.rows[::2]:
            counts[tuple(row.tokens[0].tolist())] += 1
            accept_lengths += row.accept_lengths
    return counts, accept_lengths


@pytest.mark.parametrize("drafter_name", sorted(BATCHED))
def test_batched_sampled_prefixes_follow_the_target(target, drafter_name):
    params = SETTINGS["t0.8-k6-p0.8"]
    counts, accept_lengths = sample_batched(target, drafter_name, params, num_samples=3000)
    p_value = chi_square_p_value(counts, exact_joint(target, params))
    accepted = sum(n > 1 for n in accept_lengths) / len(accept_lengths)
    assert accepted > 0.1, f"drafted tokens were accepted in only {accepted:.0%} of steps"
    assert p_value > 1e-3, (drafter_name, p_value)


def test_batched_sampling_is_the_single_decoder_for_one_row(target):
    """One row, one seed: the batched decoder draws exactly what the single decoder draws."""
    for name in sorted(BATCHED):
        single = SpeculativeDecoder(target, BATCHED[name](target))
        batched = BatchedSpeculativeDecoder(target, BATCHED[name](target))
        kwargs = {"eos_token_id": [], "do_sample": True, "top_p": 0.9}
        for seed in range(3):
            one = single.generate(
                torch.tensor([PROMPT]), 12, **kwargs, generator=torch.Generator().manual_seed(seed)
            )
            rows = batched.generate(
                torch.tensor([PROMPT]),
                max_new_tokens=12,
                **kwargs,
                generator=torch.Generator().manual_seed(seed),
            )
            assert one.tokens.tolist() == rows.rows[0].tokens.tolist(), (name, seed)
            assert one.accept_lengths == rows.rows[0].accept_lengths, (name, seed)


def test_batched_biased_rule_fails_the_same_test(target, monkeypatch):
    """The batched test can fail: rows verified with rule (d) no longer follow p."""

    def biased_rows(self, tree, logits, context):
        probs = sampling_probs(logits, context.sampling)
        return verify_sampling(tree, probs, context.generator, "biased-top-k", tree.draft_probs)

    monkeypatch.setattr(BatchedSpeculativeDecoder, "verify_rows", biased_rows)
    params = SETTINGS["t1"]
    counts, accept_lengths = sample_batched(target, "medusa", params, num_samples=1000)
    assert sum(n > 1 for n in accept_lengths) > 0
    assert chi_square_p_value(counts, exact_joint(target, params)) < 1e-3
