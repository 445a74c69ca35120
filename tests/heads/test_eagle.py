"""EagleHead and Eagle3Head: shapes, what feeds what, the draft vocabulary, checkpoints."""

import pytest
import torch

from specheads.core.target import FrozenTarget, TargetMismatchError
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    default_eagle3_layers,
    draft_vocab_from_counts,
    layer_config_from,
    load_heads,
    save_heads,
    vocab_maps,
)
from specheads.heads.checkpoint import draft_vocab_ids, read_head_config, read_label_counts
from specheads.methods import methods
from specheads.methods.eagle3 import build_heads
from specheads.train.eagle_losses import count_label_tokens
from specheads.train.recipe import load_config

from helpers import causal_mask, tiny_config, tiny_model

B, T, H, V = 2, 6, 64, 264


def positions(T: int) -> torch.Tensor:
    return torch.arange(T).expand(B, T)


def eagle_head(family="llama", **kw) -> EagleHead:
    torch.manual_seed(0)
    return EagleHead(EagleConfig(layer_config_from(tiny_config(family)), **kw)).eval()


def eagle3_head(family="llama", vd=100, layers=(1, 2, 3)) -> Eagle3Head:
    torch.manual_seed(0)
    config = Eagle3Config(layer_config_from(tiny_config(family)), draft_vocab_size=vd, target_layers=layers)
    return Eagle3Head(config).eval()


# -- EAGLE-1/2 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eagle_head_shapes_and_weights(family):
    head = eagle_head(family)
    out = head(torch.randn(B, T, H), torch.randn(B, T, H), positions(T), causal_mask(T))
    assert out.shape == (B, T, H)
    keys = set(head.state_dict())
    assert head.fc.weight.shape == (H, 2 * H) and "fc.bias" in keys
    # no first input norm, and nothing of the target's (embedding, lm_head) is stored
    assert not any("input_layernorm" in k or "embed" in k or "lm_head" in k for k in keys)
    assert all(k.startswith(("fc.", "layers.0.")) for k in keys)
    assert head.capture_layers == (4,)  # L: the last hidden state after the final norm
    assert EagleHead(EagleConfig(head.config.layer_config, fc_bias=False)).fc.bias is None


def test_eagle_fc_reads_the_embedding_first():
    head = eagle_head()
    with torch.no_grad():
        head.fc.weight[:, H:] = 0  # the feature half of fc
    embeds, features = torch.randn(B, T, H), torch.randn(B, T, H)
    out = head(features, embeds, positions(T), causal_mask(T))
    assert torch.equal(out, head(torch.randn(B, T, H), embeds, positions(T), causal_mask(T)))
    assert not torch.allclose(out, head(features, torch.randn(B, T, H), positions(T), causal_mask(T)))


def test_eagle_head_is_causal():
    head = eagle_head()
    features, embeds = torch.randn(B, T, H), torch.randn(B, T, H)
    out = head(features, embeds, positions(T), causal_mask(T))
    features[:, 3:], embeds[:, 3:] = torch.randn(B, T - 3, H), torch.randn(B, T - 3, H)
    changed = head(features, embeds, positions(T), causal_mask(T))
    assert torch.allclose(out[:, :3], changed[:, :3], atol=1e-6) and not torch.allclose(
        out[:, 3:], changed[:, 3:]
    )


# -- EAGLE-3 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eagle3_head_shapes(family):
    head = eagle3_head(family, vd=100)
    assert head.fc.weight.shape == (H, 3 * H) and head.fc.bias is None
    attn = head.midlayer.self_attn
    assert attn.q_proj.in_features == attn.k_proj.in_features == attn.v_proj.in_features == 2 * H
    assert head.lm_head.weight.shape == (100, H)
    assert head.d2t.dtype == torch.int64 and head.d2t.shape == (100,)
    assert head.t2d.dtype == torch.bool and head.t2d.shape == (V,)
    features = {i: torch.randn(B, T, H) for i in (1, 2, 3)}
    h = head(head.input_hidden(features), torch.randn(B, T, H), positions(T), causal_mask(T))
    assert h.shape == (B, T, H) and head.logits(h).shape == (B, T, 100)
    keys = set(head.state_dict())
    assert {
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "norm.weight",
        "d2t",
        "t2d",
    } <= keys
    assert not any("embed" in k for k in keys)


def test_eagle3_attention_reads_input_norm_of_embedding_then_hidden_norm():
    head = eagle3_head()
    seen = {}
    hook = head.midlayer.self_attn.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.update(x=kwargs["hidden_states"]), with_kwargs=True
    )
    hidden, embeds = torch.randn(B, T, H), torch.randn(B, T, H)
    with torch.no_grad():  # make the two norms tell apart
        head.midlayer.input_layernorm.weight.fill_(2.0)
        head.midlayer.hidden_norm.weight.fill_(3.0)
        head(hidden, embeds, positions(T), causal_mask(T))
    hook.remove()
    expected = torch.cat([head.midlayer.input_layernorm(embeds), head.midlayer.hidden_norm(hidden)], dim=-1)
    assert torch.allclose(seen["x"], expected)


def test_eagle3_layers_default_and_checks():
    assert default_eagle3_layers(32) == (2, 16, 29)  # SGLang / ModelOpt: (1, 15, 28)
    config = Eagle3Config(layer_config_from(tiny_config("llama", num_hidden_layers=12)), draft_vocab_size=10)
    assert config.target_layers == (2, 6, 9)
    assert Eagle3Config(**config.to_dict()) == config  # JSON-friendly round trip (lists -> tuple)
    with pytest.raises(ValueError, match=r"3 target layers with ids in 0..4 .* got \[1, 2, 7\]"):
        Eagle3Config(layer_config_from(tiny_config("llama")), draft_vocab_size=10, target_layers=(1, 2, 7))
    with pytest.raises(ValueError, match=r"draft_vocab_size must be in 1..264"):
        Eagle3Config(layer_config_from(tiny_config("llama")), draft_vocab_size=300)


def test_draft_vocabulary_round_trips():
    counts = torch.zeros(V, dtype=torch.long)
    counts[[200, 5, 17, 90]] = torch.tensor([50, 40, 40, 1])  # 5 and 17 tie: the smaller id first
    ids = draft_vocab_from_counts(counts, 3)
    assert ids.tolist() == [5, 17, 200]  # ascending target ids
    ids = draft_vocab_from_counts(counts, 6)  # more than were seen: unseen ids fill in id order
    assert ids.tolist() == [0, 1, 5, 17, 90, 200]
    d2t, t2d = vocab_maps(ids, V)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert torch.equal(torch.arange(6) + d2t, ids)  # target_id = i + d2t[i]
    assert torch.equal(t2d.nonzero().squeeze(-1), ids) and int(t2d.sum()) == 6
    head = eagle3_head(vd=6).set_draft_vocab(ids)
    assert torch.equal(head.to_target_ids(torch.arange(6)), ids)
    assert head.t2d[head.to_target_ids(torch.arange(6))].all()
    with pytest.raises(ValueError, match="strictly ascending"):
        vocab_maps(torch.tensor([3, 1]), V)
    with pytest.raises(ValueError, match="has 3 ids, the head predicts 6"):
        head.set_draft_vocab(torch.tensor([1, 2, 3]))


def test_eagle3_head_starts_from_the_targets_lm_head_rows_and_norm():
    """draft_head_init: target (train/config.py): lm_head row i is the target's row d2t-mapped from i, the
    norm is the target's final norm; through the recipe, `build_heads` does it only when asked."""
    target = FrozenTarget(tiny_model("llama", vocab_size=V))
    with torch.no_grad():
        target.norm.weight.uniform_(0.5, 1.5)  # a norm the fresh draft's (all ones) is not
    ids = torch.tensor([3, 7, 40, 41, 200, 263])
    head = eagle3_head(vd=6).set_draft_vocab(ids).init_from_target(target.lm_head, target.norm)
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[ids])
    assert torch.equal(head.norm.weight, target.norm.weight)
    # so the draft's logits over its vocabulary start as the target's lm_head applied after its norm
    h = torch.randn(2, 64)
    torch.testing.assert_close(head.logits(h), target.lm_head(target.norm(h))[:, ids])

    rows = [{"input_ids": list(range(10, 30)), "loss_mask": [1] * 20}]
    for init, same in (("target", True), ("random", False)):
        cfg = load_config(
            None,
            {"method": "eagle3", "eagle3": {"draft_vocab_size": 6, "draft_head_init": init}},
            methods=methods(),
        )
        built, _ = build_heads(cfg, target, count_label_tokens(rows, V))
        rows_of_target = target.lm_head.weight[built.to_target_ids(torch.arange(6))]
        assert torch.equal(built.lm_head.weight, rows_of_target) is same
    with pytest.raises(ValueError, match="eagle3.draft_head_init must be one of"):
        load_config(None, ["method=eagle3", "eagle3.draft_head_init=zeros"], methods=methods())
    with pytest.raises(ValueError, match="eagle3.noise must be >= 0, got -0.1"):
        load_config(None, ["method=eagle3", "eagle3.noise=-0.1"], methods=methods())
    with pytest.warns(UserWarning, match="'eagle3_noise' .* read by method eagle3 only"):
        load_config(None, {"method": "eagle", "eagle3_noise": 0.1}, methods=methods())
    with pytest.warns(
        UserWarning, match="section 'eagle3' .* read by method eagle3 only; method 'eagle' ignores"
    ):
        load_config(None, {"method": "eagle", "eagle3": {"noise": 0.1}}, methods=methods())
    with pytest.raises(ValueError, match="eagle3.teacher_temperature must be >= 0 .*, got -1"):
        load_config(None, ["method=eagle3", "eagle3.teacher_temperature=-1"], methods=methods())
    assert (
        load_config(
            None, ["method=eagle3", "eagle3.teacher_temperature=0"], methods=methods()
        ).settings.teacher_temperature
        == 0
    )
    with pytest.raises(ValueError, match="eagle3.out_of_vocab must be one of .*, got 'drop'"):
        load_config(None, ["method=eagle3", "eagle3.out_of_vocab=drop"], methods=methods())
    assert load_config(None, {"method": "eagle3"}, methods=methods()).settings.out_of_vocab == "skip"
    with pytest.raises(ValueError, match="eagle3.topk_loss must be >= 0 .*, got -1"):
        load_config(None, ["method=eagle3", "eagle3.topk_loss=-1"], methods=methods())
    with pytest.raises(ValueError, match="eagle3.topk_loss_weight must be >= 0, got -0.5"):
        load_config(None, ["method=eagle3", "eagle3.topk_loss_weight=-0.5"], methods=methods())
    with pytest.warns(UserWarning, match="'eagle3_topk_loss' .* read by method eagle3 only"):
        load_config(None, {"method": "medusa", "eagle3_topk_loss": 10}, methods=methods())
    assert (
        load_config(None, {"method": "eagle3"}, methods=methods()).settings.topk_loss == 0
    )  # off unless asked for


@pytest.mark.parametrize("convention", ["rope_parameters", "rope_theta"])
def test_draft_rope_theta_sets_the_draft_layers_rotary_base_and_travels_to_the_checkpoint_and_export(
    convention, tmp_path
):
    """draft_rope_theta (train/config.py): the draft's rotary embedding is built with that base, not the
    target's (0, the default, keeps the target's); the native checkpoint and the eagle3 export say so, in
    either transformers convention of the layer config."""
    import json

    from specheads.heads.eagle import with_rope_theta
    from specheads.heads.formats import export_heads

    target = FrozenTarget(tiny_model("llama", vocab_size=V))
    layer = layer_config_from(target.config)
    if convention == "rope_theta":  # the older convention: a top-level rope_theta
        layer = {k: v for k, v in layer.items() if k != "rope_parameters"} | {"rope_theta": 500000.0}
    set_to = with_rope_theta(layer, 1234.0)
    assert (set_to.get("rope_parameters") or set_to)["rope_theta"] == 1234.0 and layer != set_to
    rows = [{"input_ids": list(range(10, 30)), "loss_mask": [1] * 20}]
    for theta in (0.0, 1234.0):
        cfg = load_config(
            None,
            {"method": "eagle3", "eagle3": {"draft_vocab_size": 6, "draft_rope_theta": theta}},
            methods=methods(),
        )
        built, _ = build_heads(cfg, target, count_label_tokens(rows, V))
        dim = built.rotary_emb.inv_freq.numel() * 2
        base = theta or target.model.model.rotary_emb.inv_freq[1].item() ** (-dim / 2)
        expected = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        torch.testing.assert_close(built.rotary_emb.inv_freq.double(), expected, rtol=1e-5, atol=0)
    save_heads(built, tmp_path / "native", target.record(), {})
    loaded, _ = load_heads(tmp_path / "native", target, methods=methods())
    assert torch.equal(loaded.rotary_emb.inv_freq, built.rotary_emb.inv_freq)
    export_heads(tmp_path / "native", "eagle3", tmp_path / "export", methods=methods())
    assert json.loads((tmp_path / "export" / "config.json").read_text())["rope_theta"] == 1234.0
    with pytest.raises(
        ValueError, match="eagle3.draft_rope_theta must be > 0, or 0 for the target's; got -1"
    ):
        load_config(None, ["method=eagle3", "eagle3.draft_rope_theta=-1"], methods=methods())
    with pytest.raises(ValueError, match="a rope theta must be > 0"):
        with_rope_theta(layer, 0)


# -- checkpoints --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_checkpoint_round_trip_is_bit_equal(method, tmp_path):
    target = FrozenTarget(tiny_model("qwen2", vocab_size=V))
    if method == "eagle":
        head = EagleHead(EagleConfig(layer_config_from(target.config)))
    else:
        head = Eagle3Head(Eagle3Config(layer_config_from(target.config), draft_vocab_size=50))
        head.set_draft_vocab(torch.randperm(V)[:50].sort().values)
    save_heads(head, tmp_path, target.record(), {"lr": 1e-3})
    loaded, config = load_heads(tmp_path, target, methods=methods())
    state, back = head.state_dict(), loaded.state_dict()
    assert state.keys() == back.keys()
    assert all(torch.equal(state[k], back[k]) and state[k].dtype == back[k].dtype for k in state)
    assert config["capture_layers"] == list(head.capture_layers)
    assert "SGLang" in config["capture_layers_indexing"]
    assert (
        read_head_config(tmp_path, methods=methods())["head_config"]["layer_config"]["model_type"] == "qwen2"
    )
    other = FrozenTarget(tiny_model("qwen2", vocab_size=V, hidden_size=32))
    with pytest.raises(TargetMismatchError, match="hidden_size: heads in .* trained for 64, target has 32"):
        load_heads(tmp_path, other, methods=methods())


def test_label_counts_travel_with_the_checkpoint_and_rank_a_draft_vocabulary(tmp_path):
    """save_heads(label_counts=) writes label_counts.safetensors; draft_vocab_ids takes the most frequent
    ids, ascending (ties to the smaller id); a checkpoint without counts, or of another size, is refused."""
    target = FrozenTarget(tiny_model("qwen2", vocab_size=V))
    head = EagleHead(EagleConfig(layer_config_from(target.config)))
    counts = torch.zeros(V, dtype=torch.long)
    counts[[7, 3, 90, 12]] = torch.tensor([5, 9, 5, 1])
    save_heads(head, tmp_path / "with", target.record(), label_counts=counts)
    assert torch.equal(read_label_counts(tmp_path / "with"), counts)
    assert draft_vocab_ids(tmp_path / "with", 3, V).tolist() == [3, 7, 90]
    assert draft_vocab_ids(tmp_path / "with", 5, V).tolist() == [0, 3, 7, 12, 90]  # unseen fill in id order
    save_heads(head, tmp_path / "without", target.record())
    assert read_label_counts(tmp_path / "without") is None
    with pytest.raises(ValueError, match="has no label_counts.safetensors"):
        draft_vocab_ids(tmp_path / "without", 3, V)
    with pytest.raises(ValueError, match=f"counts {V} tokens; the target has {V + 1}"):
        draft_vocab_ids(tmp_path / "with", 3, V + 1)
    with pytest.raises(ValueError, match=f"label_counts has shape \\(3,\\); the target's vocabulary is {V}"):
        save_heads(head, tmp_path / "bad", target.record(), label_counts=torch.ones(3, dtype=torch.long))
