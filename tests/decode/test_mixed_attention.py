"""Targets whose layers mix sliding-window and full attention (Gemma-2, Gemma-3 text, gpt-oss): the tree
forward gets one mask per layer type, and decoding equals the target's own `generate`, greedy token for
token (single and batched, Medusa and EAGLE / EAGLE-3 trees with whole paths accepted), sampled in law
(chi-square). Prompts and generations run past the window (8; 4 for the sampling tests), so it bites.

Gemma-2 and gpt-oss attend eagerly (transformers refuses sdpa for both: Gemma-2 softcaps the scores,
gpt-oss adds attention sinks), Gemma-3 with sdpa. The EAGLE heads here have a Llama draft layer sized from
the target, as the engines' draft layer is.
"""

from types import SimpleNamespace

import pytest
import torch
from test_batched import PAD, Inject, continuation, generate_rows
from test_decoder import ORACLE_TREES, random_medusa
from test_sampling_decoder import SETTINGS, chi_square_p_value, exact_joint, sample_batched, sample_prefixes
from test_sampling_decoder import VOCAB as SAMPLING_VOCAB
from test_tree_inputs import assert_tree_matches_paths, forward_tree, random_draft
from transformers import LlamaConfig

from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, SpeculativeDecoder, attention_window, default_tree, tree_inputs
from specheads.decode.batched import BatchedSpeculativeDecoder, as_batched
from specheads.decode.batched_inputs import left_pad
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from

from decode_helpers import random_prompts, reference_generate
from helpers import MIXED_FAMILIES, tiny_mixed_model

VOCAB = 264
WINDOW = 8
FAMILIES = sorted(MIXED_FAMILIES)


@pytest.fixture(scope="module")
def targets():
    made = {}

    def get(family: str) -> FrozenTarget:
        if family not in made:
            made[family] = FrozenTarget(tiny_mixed_model(family, WINDOW, vocab_size=VOCAB))
        return made[family]

    return get


def llama_layer_config(config) -> dict:
    """A Llama draft layer's config sized from the target's."""
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    llama = LlamaConfig(
        **{k: getattr(config, k) for k in sizes},
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )
    return layer_config_from(llama)


def make_drafter(kind: str, target: FrozenTarget):
    """A fresh batch-1 drafter: random Medusa heads, or an EAGLE / EAGLE-3 head with a static or
    dynamic (EAGLE-2) tree ("eagle3-dynamic")."""
    if kind == "medusa":
        return MedusaDrafter(random_medusa(target), default_tree("medusa-15"))
    method, tree = kind.split("-")
    torch.manual_seed(0)
    layers = llama_layer_config(target.config)
    if method == "eagle":
        head = EagleHead(EagleConfig(layers)).eval()
    else:
        head = Eagle3Head(Eagle3Config(layers, draft_vocab_size=VOCAB, target_layers=(1, 2, 4))).eval()
    if tree == "dynamic":
        return EagleDrafter(head, target, top_k=4, depth=4, total_tokens=16)
    return EagleDrafter(head, target, default_tree("medusa-15"))


# -- the masks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_layer_type_gets_its_window(family, targets):
    config = targets(family).config
    assert attention_window(config) == {"full_attention": None, "sliding_attention": WINDOW}
    # a single kind of layer keeps the single mask it had
    assert (
        attention_window(tiny_mixed_model(family, WINDOW, layer_types=["full_attention"] * 4).config) is None
    )
    assert attention_window(tiny_mixed_model(family, 5, layer_types=["sliding_attention"] * 4).config) == 5


def test_layer_types_other_than_full_and_sliding_are_refused():
    config = tiny_mixed_model("gemma2").config
    config.layer_types = ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]
    with pytest.raises(ValueError, match=r"\['chunked_attention'\] layers.*cannot mask"):
        attention_window(config)
    # configs from before layer_types (older transformers) say which layers slide some other way
    for older in (dict(cache_implementation="hybrid"), dict(sliding_window_pattern=6)):
        config = SimpleNamespace(model_type="gemma2", sliding_window=4, **older)
        with pytest.raises(
            ValueError, match="gemma2 target alternates.*no layer_types.*upgrade transformers"
        ):
            attention_window(config)


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_logits_equal_plain_forward_of_each_path(family, targets):
    model = targets(family).model
    prompt = torch.randint(0, 256, (1, 14), generator=torch.Generator().manual_seed(2))
    draft = random_draft("medusa-31")  # 4 deep: its nodes sit at positions 14..18, the window 8 behind
    window = attention_window(model.config)
    inputs = tree_inputs(draft, 14, torch.float32, window)
    assert set(inputs.attention_mask) == {"full_attention", "sliding_attention"}
    logits, cache = forward_tree(model, prompt, draft, window=window)
    assert cache.get_seq_length() == 14 + draft.num_nodes  # every layer keeps every position
    assert all(layer.keys.shape[-2] == 14 + draft.num_nodes for layer in cache.layers)
    assert_tree_matches_paths(model, prompt, draft, logits)
    # the window bites: the full mask on every layer gives other logits
    logits, _ = forward_tree(model, prompt, draft, window=None)
    with pytest.raises(AssertionError):
        assert_tree_matches_paths(model, prompt, draft, logits, atol=1e-3)


# -- greedy: one prompt --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_medusa_and_oracle_trees_equal_generate(family, targets, oracle):
    target = targets(family)
    model = target.model
    decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), default_tree("medusa-63")))
    prompts = random_prompts(3, seed=1, low=3, high=20)
    for prompt in prompts:
        out = decoder.generate(prompt, max_new_tokens=24)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 24)), prompt.tolist()
    accept_lengths = []
    for i, prompt in enumerate(prompts):  # whole drafted paths accepted, past the window
        drafter = oracle(model, prompt, ORACLE_TREES["medusa-15"], 30, miss=0.25, seed=i)
        out = SpeculativeDecoder(target, drafter).generate(prompt, 30, eos_token_id=[])
        assert out.tokens[0].tolist() == continuation(model, prompt, 30)[prompt.shape[1] :], prompt.tolist()
        accept_lengths += out.accept_lengths
    assert max(accept_lengths) >= 3


@pytest.mark.parametrize("kind", ["eagle-static", "eagle3-dynamic"])
@pytest.mark.parametrize("family", FAMILIES)
def test_eagle_trees_equal_generate(family, kind, targets):
    target = targets(family)
    prompts = random_prompts(2, seed=3, low=3, high=20)
    truths = {r: continuation(target.model, p, 40) for r, p in enumerate(prompts)}
    accept_lengths = []
    for r, prompt in enumerate(prompts):
        drafter = Inject(make_drafter(kind, target), truths, max_depth=3, row=r)
        out = SpeculativeDecoder(target, drafter).generate(prompt, 30, eos_token_id=[])
        assert out.tokens[0].tolist() == truths[r][prompt.shape[1] :][:30], (kind, r)
        accept_lengths += out.accept_lengths
    assert max(accept_lengths) >= 3  # whole drafted paths accepted


# -- greedy: batched --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["medusa", "eagle3-static"])
@pytest.mark.parametrize("family", FAMILIES)
def test_batched_rows_equal_generate(family, kind, targets):
    """Left-padded rows of different lengths accepting paths of different lengths: each row equals the
    target's own batched `generate`, and the row decoded alone."""
    target = targets(family)
    prompts = random_prompts(3, seed=4, low=2, high=20)
    truths = {r: continuation(target.model, p, 40) for r, p in enumerate(prompts)}
    ids, mask = left_pad(prompts, PAD)
    drafter = Inject(as_batched(make_drafter(kind, target)), truths, max_depth=3)
    out = BatchedSpeculativeDecoder(target, drafter).generate(ids, mask, 25, eos_token_id=[])
    generated = generate_rows(target.model, prompts, 25, eos=[])
    for r, prompt in enumerate(prompts):
        assert out.rows[r].tokens[0].tolist() == generated[r] == truths[r][prompt.shape[1] :][:25], r
        alone = SpeculativeDecoder(target, Inject(make_drafter(kind, target), truths, 3, row=r))
        assert alone.generate(prompt, 25, eos_token_id=[]).tokens.tolist() == out.rows[r].tokens.tolist()
    assert max(n for row in out.rows for n in row.accept_lengths) == 4


# -- sampling ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampling_target():
    """gpt-oss with a window of 4 over the sampling tests' 5-token prompt and 3 new tokens, its lm_head scaled
    up as theirs is (p peaked, not one-hot)."""
    model = tiny_mixed_model(
        "gpt_oss", 4, vocab_size=SAMPLING_VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return FrozenTarget(model)


@pytest.mark.parametrize("drafter_name", ["medusa", "eagle-dynamic"])
def test_sampled_prefixes_follow_the_target(sampling_target, drafter_name):
    params = SETTINGS["t0.8-k6-p0.8"]
    counts, accept_lengths = sample_prefixes(sampling_target, drafter_name, params, num_samples=3000)
    p_value = chi_square_p_value(counts, exact_joint(sampling_target, params))
    assert sum(n > 1 for n in accept_lengths) / len(accept_lengths) > 0.1
    assert p_value > 1e-3, (drafter_name, p_value)


def test_batched_sampled_prefixes_follow_the_target(sampling_target):
    params = SETTINGS["t0.8-k6-p0.8"]
    counts, accept_lengths = sample_batched(sampling_target, "medusa-iid", params, num_samples=3000)
    p_value = chi_square_p_value(counts, exact_joint(sampling_target, params))
    assert sum(n > 1 for n in accept_lengths) / len(accept_lengths) > 0.1
    assert p_value > 1e-3, p_value
