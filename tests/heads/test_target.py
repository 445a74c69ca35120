"""FrozenTarget: capture equals HF's own hidden states, frozen weights, target records, clear errors."""

import pytest
import torch

from specheads.core.target import FrozenTarget, TargetMismatchError, TargetRecord, choose_attention

from helpers import FAMILIES, tiny_config, tiny_mixed_model, tiny_model, tiny_tokenizer


def ids(batch=2, length=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, length), generator=g)


def test_capture_equals_output_hidden_states(model, tokenizer):
    target = FrozenTarget(model, tokenizer)
    x = ids()
    reference = model(input_ids=x, output_hidden_states=True)
    n = target.num_layers
    assert len(reference.hidden_states) == n + 1
    out = target(x, capture=range(n + 1))
    assert sorted(out.hidden) == list(range(n + 1))
    for i in range(n + 1):
        assert torch.equal(out.hidden[i], reference.hidden_states[i]), f"layer {i}"
    assert torch.equal(out.logits, reference.logits)
    # id L is after the final norm: what the lm_head reads.
    assert torch.allclose(target.lm_head(out.hidden[n]), out.logits, atol=1e-6)


def test_only_requested_layers_are_kept_and_negative_ids_count_from_the_end(model):
    target = FrozenTarget(model)
    x = ids()
    out = target(x, capture=(-1, 2))
    assert sorted(out.hidden) == [2, target.num_layers]
    full = model(input_ids=x, output_hidden_states=True).hidden_states
    assert torch.equal(out.hidden[target.num_layers], full[-1])
    assert torch.equal(out.hidden[2], full[2])


def test_hooks_are_removed_after_forward(model):
    target = FrozenTarget(model)
    target(ids(), capture=range(target.num_layers + 1))
    modules = [*target.layers, target.norm]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)


def test_without_logits_skips_lm_head_and_gives_same_states(model):
    target = FrozenTarget(model)
    x = ids()
    calls = []
    handle = target.lm_head.register_forward_hook(lambda *a: calls.append(1))
    out = target(x, capture=(1, -1), logits=False)
    handle.remove()
    assert out.logits is None and not calls
    ref = target(x, capture=(1, -1))
    for k in ref.hidden:
        assert torch.equal(out.hidden[k], ref.hidden[k])


def test_parameters_are_frozen_and_eval_mode_is_kept(model):
    target = FrozenTarget(model)
    assert all(not p.requires_grad for p in model.parameters())
    model.train()  # a careless caller
    out = target(ids(), capture=(-1,))
    assert not model.training
    assert not out.logits.requires_grad and not out.hidden[target.num_layers].requires_grad


def test_grad_flag_lets_gradients_flow_without_unfreezing(model):
    target = FrozenTarget(model)
    x = ids()
    embeds_hook_out = []
    h = target.embed_tokens.register_forward_hook(lambda m, a, o: embeds_hook_out.append(o.requires_grad_()))
    out = target(x, capture=(-1,), grad=True)
    h.remove()
    out.logits.sum().backward()
    assert embeds_hook_out[0].grad is not None
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())


def test_accessors(model, tokenizer):
    target = FrozenTarget(model, tokenizer)
    assert target.embed_tokens is model.get_input_embeddings()
    assert target.lm_head is model.get_output_embeddings()
    assert target.norm is model.model.norm
    assert target.hidden_size == 64 and target.vocab_size == len(tokenizer) and target.num_layers == 4


@pytest.mark.parametrize("bad", [5, -6, 99])
def test_unknown_layer_id_is_a_clear_error(bad):
    target = FrozenTarget(tiny_model("llama"))
    with pytest.raises(ValueError, match=f"unknown layer id {bad}.*0..4"):
        target(ids(), capture=(bad,))


def test_non_integer_layer_id_is_a_clear_error():
    target = FrozenTarget(tiny_model("llama"))
    with pytest.raises(TypeError, match="layer id must be an int, got 'last'"):
        target(ids(), capture=("last",))


def test_not_a_causal_lm_is_a_clear_error():
    with pytest.raises(TypeError, match="Linear is not a Hugging Face causal LM"):
        FrozenTarget(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("fam", FAMILIES)
def test_from_pretrained_and_record(fam, tiny_target_dirs, tokenizer):
    path = tiny_target_dirs[fam]
    target = FrozenTarget.from_pretrained(str(path), dtype="float32")
    assert all(not p.requires_grad for p in target.model.parameters())
    rec = target.record()
    assert rec.model_type == fam and rec.vocab_size == len(tokenizer) and rec.hidden_size == 64
    assert rec.num_layers == 4 and rec.name_or_path == str(path)
    assert rec.vocab_hash == FrozenTarget(tiny_model(fam), tokenizer).record().vocab_hash
    assert TargetRecord.from_dict(rec.to_dict()) == rec
    rec.check_matches(rec)


def test_from_pretrained_honours_dtype_and_attention(tiny_target_dirs):
    target = FrozenTarget.from_pretrained(
        str(tiny_target_dirs["llama"]), dtype="bf16", attn_implementation="eager"
    )
    assert target.dtype == torch.bfloat16
    assert target.model.config._attn_implementation == "eager"


@pytest.mark.parametrize(
    "family, chosen",
    [
        ("llama", "sdpa"),
        ("qwen3", "sdpa"),
        ("gemma3_text", "sdpa"),
        ("gemma2", "eager"),
        ("gpt_oss", "eager"),
    ],
)
def test_auto_attention_is_sdpa_unless_the_family_refuses_it(family, chosen):
    config = tiny_config(family, head_dim=16)
    implementation, why = choose_attention(config)
    assert implementation == chosen
    if chosen == "eager":  # transformers refuses sdpa: Gemma-2 softcaps its scores, gpt-oss adds sinks
        assert "refuses sdpa" in why and "ForCausalLM" in why
        with pytest.raises(ValueError, match=f"refuses sdpa.*{family}.*'eager', or 'auto'"):
            choose_attention(config, "sdpa")
    assert choose_attention(config, "eager") == ("eager", "eager: as asked")


def test_a_gemma2_target_loads_eager_by_itself_and_decodes_as_generate(tmp_path):
    """A family transformers refuses sdpa for, saved as a plain HF directory: the default load picks eager
    and says so, and the tree decoder's masks read right under it (greedy output equals generate)."""
    from specheads.decode import MedusaDrafter, SpeculativeDecoder, default_tree
    from specheads.heads import MedusaConfig, MedusaHeads

    tokenizer = tiny_tokenizer()
    tiny_mixed_model("gemma2", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    target = FrozenTarget.from_pretrained(str(tmp_path), dtype="float32")
    assert target.attn_implementation == "eager"
    assert target.attention_choice == "auto: eager, as transformers refuses sdpa for Gemma2ForCausalLM"
    with pytest.raises(ValueError, match="refuses sdpa.*Gemma2ForCausalLM.*'eager'"):
        FrozenTarget.from_pretrained(str(tmp_path), attn_implementation="sdpa")
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    decoder = SpeculativeDecoder(target, MedusaDrafter(heads.eval(), default_tree("chain-4", num_heads=2)))
    prompt = ids(batch=1, length=12)  # longer than the window (8) with what it generates
    expected = target.model.generate(prompt, max_new_tokens=12, do_sample=False)[:, 12:]
    assert torch.equal(decoder.generate(prompt, 12).tokens, expected)


def test_wrong_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"target '{missing}': no such directory"):
        FrozenTarget.from_pretrained(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="a directory without a config.json"):
        FrozenTarget.from_pretrained(str(tmp_path / "empty"))


def test_unreachable_hub_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="'no-such-org/no-such-model'.*not reachable on the hub"):
        FrozenTarget.from_pretrained("no-such-org/no-such-model")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "float17"}, "unknown dtype 'float17'"),
        ({"attn_implementation": "paged"}, "unknown attn_implementation 'paged'"),
    ],
)
def test_unsupported_requests_are_clear_errors(tiny_target_dirs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        FrozenTarget.from_pretrained(str(tiny_target_dirs["llama"]), **kwargs)


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path):
    from transformers import ViTConfig

    ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    ).save_pretrained(tmp_path)
    with pytest.raises(TypeError, match="model_type 'vit'.*is not a causal LM"):
        FrozenTarget.from_pretrained(str(tmp_path))


def test_record_mismatch_names_every_field(tokenizer):
    rec = FrozenTarget(tiny_model("llama"), tokenizer).record()
    other = TargetRecord(**{**rec.to_dict(), "vocab_size": 32000, "hidden_size": 4096, "name_or_path": "big"})
    with pytest.raises(TargetMismatchError) as err:
        rec.check_matches(other)
    msg = str(err.value)
    assert "vocab_size: heads trained for 264, target has 32000" in msg
    assert "hidden_size: heads trained for 64, target has 4096" in msg
    assert "num_layers" not in msg
    # A copy of the same model elsewhere is the same target.
    rec.check_matches(TargetRecord(**{**rec.to_dict(), "name_or_path": "/elsewhere"}))


def test_record_mismatch_on_vocabulary(tokenizer):
    rec = FrozenTarget(tiny_model("llama"), tokenizer).record()
    other = TargetRecord(**{**rec.to_dict(), "vocab_hash": "0" * 64})
    with pytest.raises(TargetMismatchError, match="vocab_hash"):
        rec.check_matches(other)


def test_record_from_incomplete_dict_is_a_clear_error():
    with pytest.raises(ValueError, match=r"missing fields \['vocab_hash'"):
        TargetRecord.from_dict(
            {"name_or_path": "x", "model_type": "llama", "vocab_size": 3, "hidden_size": 2, "num_layers": 1}
        )
