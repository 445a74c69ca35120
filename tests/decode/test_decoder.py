"""SpeculativeDecoder: greedy output equals the target's own `generate(do_sample=False)` token for
token, for every family, tree shape and stopping point (EOS or max_new_tokens inside an accepted path)."""

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.decode import (
    DecodeOutput,
    DraftContext,
    MedusaDrafter,
    SpeculativeDecoder,
    StaticTree,
    build_tree,
    default_tree,
    eos_ids,
)
from specheads.decode.decoder import PHASES
from specheads.heads import MedusaConfig, MedusaHeads

from decode_helpers import greedy_continuation, random_prompts, recording, reference_generate
from helpers import tiny_model

VOCAB = 264
# Trees for the oracle: a chain, Medusa's small and full trees, and one from the builder (top-3 x 3 heads).
ORACLE_TREES = {
    "chain-4": default_tree("chain-4"),
    "medusa-15": default_tree("medusa-15"),
    "medusa-63": default_tree("medusa-63"),
    "built-12": StaticTree.from_choices(build_tree([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]], 12)),
}


def random_medusa(target, num_heads=4, share_lm_head=False, seed=0):
    """Medusa heads moved off their (identity) initialisation, as after some training."""
    config = MedusaConfig(
        hidden_size=target.hidden_size,
        vocab_size=target.vocab_size,
        num_heads=num_heads,
        share_lm_head=share_lm_head,
    )
    heads = MedusaHeads(config)
    if not share_lm_head:
        heads.init_lm_heads_from(target.lm_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return heads.eval()


def check_accounting(out: DecodeOutput, max_new_tokens: int):
    assert out.tokens.shape[1] == 1 + sum(out.accept_lengths) or out.steps == 0
    assert out.tokens.shape[1] <= max_new_tokens
    assert all(n >= 1 for n in out.accept_lengths)


def eos_inside_a_step(truth: list[int], step: int = 5) -> int | None:
    """The deepest index of `truth` that holds a token's first occurrence and falls inside a step of
    `step` tokens (index 0 comes from prefill; steps then cover 1..5, 6..10, ...), or None."""
    firsts = [i for i, token in enumerate(truth) if token not in truth[:i]]
    inside = [i for i in firsts if i >= 1 and i % step != 0]
    return max(inside) if inside else None


# -- greedy equality --------------------------------------------------------------------------------


@pytest.mark.parametrize("tree_name", ["chain-4", "medusa-63"])
def test_medusa_drafter_equals_generate(family, tree_name):
    model = tiny_model(family, vocab_size=VOCAB)
    target = FrozenTarget(model)
    decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), default_tree(tree_name)))
    for prompt in random_prompts(3, seed=1):
        out = decoder.generate(prompt, max_new_tokens=24)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 24)), prompt.tolist()
        check_accounting(out, 24)


RecordingMedusa = recording(MedusaDrafter)


def test_medusa_over_a_draft_vocabulary_proposes_from_it_and_equals_generate():
    """`vocab`: the heads propose their top-k among those ids only (the whole vocabulary named drafts the
    same trees as none), and the output is generate()'s either way."""
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    heads = random_medusa(target)
    tree = default_tree("medusa-63")
    prompt = random_prompts(1, seed=5)[0]
    runs = {}
    for name, vocab in (("none", None), ("all", torch.arange(VOCAB)), ("thirds", torch.arange(0, VOCAB, 3))):
        drafter = RecordingMedusa(heads, tree, vocab=vocab)
        out = SpeculativeDecoder(target, drafter).generate(prompt, 24)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 24)), name
        runs[name] = drafter.trees
    assert [t.tokens.tolist() for t in runs["none"]] == [t.tokens.tolist() for t in runs["all"]]
    drafted = torch.cat([t.tokens[:, 1:] for t in runs["thirds"]])
    assert drafted.numel() > 0 and (drafted % 3 == 0).all()
    with torch.no_grad():  # the first step's depth-1 guesses: head 0's top ranks among the thirds
        context = torch.cat([prompt, runs["thirds"][0].tokens[:, :1]], 1)
        feature = target(context[:, :-1], capture=(-1,)).hidden[target.layer_id(-1)][:, -1:]
        logits = heads(feature)[0, 0, 0]
    thirds = torch.arange(0, VOCAB, 3)
    expected = thirds[logits[thirds].topk(10).indices]
    depth1 = [i for i, d in enumerate(tree.depths) if d == 1]
    assert runs["thirds"][0].tokens[0, depth1].tolist() == expected[[tree.ranks[i] for i in depth1]].tolist()
    with pytest.raises(ValueError, match="vocab must be 1..264 target ids"):
        MedusaDrafter(heads, tree, vocab=torch.arange(0))


@pytest.mark.parametrize("share", [False, True], ids=["own-projections", "shared-lm-head"])
def test_medusa_drafts_each_heads_top_k_however_it_projects(share):
    """Two residual blocks per head, all heads' blocks run as one batched matmul per layer, then either the
    transposed copy of the projections (the CPU's route) or the heads' own modules (off the CPU): each
    node takes its head's rank-r guess of the heads' own forward, for two rows at once."""
    target = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))
    config = MedusaConfig(target.hidden_size, VOCAB, num_heads=3, num_layers=2, share_lm_head=share)
    heads = MedusaHeads(config)
    if not share:
        heads.init_lm_heads_from(target.lm_head)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    heads.eval()
    tree = default_tree("medusa-15", num_heads=3)
    feature = torch.randn(2, 1, target.hidden_size, generator=g)
    context = DraftContext(tokens=torch.tensor([[7], [9]]), hidden={-1: feature}, step=0)
    with torch.no_grad():
        guesses = heads(feature, target.lm_head)[:, :, 0].topk(10).indices  # (K, B, 10)
    expected = [
        [guesses[d - 1, b, r].item() for d, r in zip(tree.depths[1:], tree.ranks[1:])] for b in (0, 1)
    ]
    for route in ("transposed copy", "the heads' own"):
        drafter = MedusaDrafter(heads, tree, target.lm_head if share else None)
        if route == "the heads' own":
            drafter._projection = None
        drafted = drafter.propose(context)
        assert drafted.tokens[:, 0].tolist() == [7, 9], route
        assert drafted.tokens[:, 1:].tolist() == expected, route


def test_medusa_drafter_with_shared_lm_head_and_fewer_heads():
    model = tiny_model("qwen2", vocab_size=VOCAB)
    target = FrozenTarget(model)
    heads = random_medusa(target, num_heads=2, share_lm_head=True)
    with pytest.raises(ValueError, match="share the target's lm_head"):
        MedusaDrafter(heads, default_tree("medusa-15", num_heads=2))
    with pytest.raises(ValueError, match=r"\(0, 0, 0\) has depth 3 but there are only 2 heads"):
        MedusaDrafter(heads, default_tree("medusa-15"), lm_head=target.lm_head)
    decoder = SpeculativeDecoder(
        target, MedusaDrafter(heads, default_tree("medusa-15", num_heads=2), target.lm_head)
    )
    prompt = random_prompts(1, seed=2)[0]
    assert torch.equal(decoder.generate(prompt, 20).tokens, reference_generate(model, prompt, 20))


def test_oracle_paths_are_accepted_and_output_equals_generate(family, oracle):
    """Many prompts x several tree shapes, with whole drafted paths accepted."""
    model = tiny_model(family, vocab_size=VOCAB)
    target = FrozenTarget(model)
    accept_lengths = []
    for i, prompt in enumerate(random_prompts(6, seed=3)):
        for name, tree in ORACLE_TREES.items():
            drafter = oracle(model, prompt, tree, 30, miss=0.25, seed=i)
            out = SpeculativeDecoder(target, drafter).generate(prompt, 30, eos_token_id=[])
            expected = greedy_continuation(model, prompt, 30)
            assert out.tokens[0].tolist() == expected, (name, prompt.tolist())
            assert out.accept_lengths[:-1] == drafter.verified[: out.steps - 1], (
                name
            )  # the oracle's paths were taken
            check_accounting(out, 30)
            accept_lengths += out.accept_lengths
    assert max(accept_lengths) == 5 and sum(accept_lengths) / len(accept_lengths) > 2


@pytest.mark.parametrize("attn", ["eager"])
def test_eager_attention_equals_generate(family, attn, oracle):
    model = tiny_model(family, vocab_size=VOCAB, attn_implementation=attn)
    target = FrozenTarget(model)
    for i, prompt in enumerate(random_prompts(2, seed=4)):
        drafter = oracle(model, prompt, ORACLE_TREES["medusa-15"], 25, seed=i)
        out = SpeculativeDecoder(target, drafter).generate(prompt, 25)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 25))


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("mistral", dict(sliding_window=5)),
        ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=0)),
    ],
)
def test_sliding_window_target_equals_generate(family, overrides, oracle):
    model = tiny_model(family, vocab_size=VOCAB, **overrides)
    target = FrozenTarget(model)
    for i, prompt in enumerate(random_prompts(2, seed=5, low=8)):
        drafter = oracle(model, prompt, ORACLE_TREES["medusa-15"], 25, seed=i)
        out = SpeculativeDecoder(target, drafter).generate(prompt, 25)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 25))


def test_root_only_tree_is_plain_autoregressive_decoding():
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), StaticTree.from_choices([])))
    prompt = random_prompts(1, seed=6)[0]
    out = decoder.generate(prompt, 15)
    assert torch.equal(out.tokens, reference_generate(model, prompt, 15))
    assert out.accept_lengths == [1] * 14 and out.mean_accept_length == 1.0


# -- stopping: EOS and max_new_tokens inside an accepted path ---------------------------------------


def test_eos_inside_an_accepted_path_cuts_the_output_there(family, oracle):
    model = tiny_model(family, vocab_size=VOCAB)
    target = FrozenTarget(model)
    chain = ORACLE_TREES["chain-4"]  # with miss=0 every step accepts all 4 candidates + the bonus: 5 tokens
    cases = 0
    for prompt in random_prompts(8, seed=7):
        truth = greedy_continuation(model, prompt, 40)
        at = eos_inside_a_step(truth)
        if at is None:  # a continuation that repeats one token from the start
            continue
        # a list, as generation configs often give it, with a second id that never occurs
        model.generation_config.eos_token_id = (
            [truth[at], VOCAB - 1] if VOCAB - 1 not in truth else [truth[at]]
        )
        assert eos_ids(target) == set(model.generation_config.eos_token_id)
        out = SpeculativeDecoder(target, oracle(model, prompt, chain, 40, miss=0.0)).generate(prompt, 40)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 40)), prompt.tolist()
        assert out.tokens[0].tolist() == truth[: at + 1]
        # full steps, then the step holding the EOS, cut right after it
        assert out.accept_lengths == [5] * ((at - 1) // 5) + [(at - 1) % 5 + 1]
        cases += 1
        if cases == 3:
            break
    assert cases == 3


@pytest.mark.parametrize("max_new_tokens", [1, 2, 8, 13, 16])
def test_max_new_tokens_inside_an_accepted_path(max_new_tokens, oracle):
    model = tiny_model("mistral", vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompt = random_prompts(1, seed=8)[0]
    out = SpeculativeDecoder(target, oracle(model, prompt, ORACLE_TREES["chain-4"], 20, miss=0.0)).generate(
        prompt, max_new_tokens, eos_token_id=[]
    )
    assert out.tokens[0].tolist() == greedy_continuation(model, prompt, max_new_tokens)
    # 1 token from prefill, then full steps of 5, the last one cut to what was left
    full, rest = divmod(max_new_tokens - 1, 5)
    assert out.accept_lengths == [5] * full + ([rest] if rest else [])


def test_first_token_eos_and_zero_tokens():
    model = tiny_model("qwen3", vocab_size=VOCAB)
    target = FrozenTarget(model)
    decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), default_tree("medusa-15")))
    prompt = random_prompts(1, seed=9)[0]
    first = greedy_continuation(model, prompt, 1)[0]
    out = decoder.generate(prompt, 10, eos_token_id=first)
    assert out.tokens.tolist() == [[first]] and out.steps == 0
    assert decoder.generate(prompt, 0).tokens.shape == (1, 0)


# -- bookkeeping and errors ---------------------------------------------------------------------------


def test_timings_and_tau_are_recorded(oracle):
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompt = random_prompts(1, seed=10)[0]
    out = SpeculativeDecoder(target, oracle(model, prompt, ORACLE_TREES["medusa-15"], 20)).generate(
        prompt, 20, eos_token_id=[]
    )
    assert set(out.timings) == {*PHASES, "total"}
    assert sum(v for k, v in out.timings.items() if k != "total") <= out.timings["total"]
    assert out.mean_accept_length == pytest.approx(19 / out.steps)


def test_one_prompt_at_a_time():
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), default_tree("chain-4")))
    with pytest.raises(ValueError, match=r"one prompt \(1, T\), got shape \(2, 5\)"):
        decoder.generate(torch.zeros(2, 5, dtype=torch.long), 4)
