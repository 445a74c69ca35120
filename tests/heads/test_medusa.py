"""Medusa heads: offsets, zero-init, independent blocks, native checkpoints."""

import json

import pytest
import torch

from specheads.core.target import FrozenTarget, TargetMismatchError
from specheads.heads import MedusaConfig, MedusaHeads, load_heads, save_heads
from specheads.heads.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from specheads.methods import methods

from helpers import tiny_model


def fresh_heads(target: FrozenTarget, **kw) -> MedusaHeads:
    cfg = MedusaConfig(hidden_size=target.hidden_size, vocab_size=target.vocab_size, **kw)
    heads = MedusaHeads(cfg)
    if not cfg.share_lm_head:
        heads.init_lm_heads_from(target.lm_head)
    return heads


def test_fresh_heads_reproduce_the_targets_next_token_logits(model, tokenizer):
    """Zero-initialised blocks are the identity, and each projection starts as the target's lm_head."""
    target = FrozenTarget(model, tokenizer)
    x = torch.randint(0, 256, (2, 11))
    out = target(x, capture=(-1,))
    heads = fresh_heads(target, num_heads=3, num_layers=2)
    logits = heads(out.hidden[target.num_layers])
    assert logits.shape == (3, 2, 11, target.vocab_size)
    for k in range(3):
        assert torch.equal(logits[k], out.logits)
    shared = fresh_heads(target, num_heads=2, share_lm_head=True)
    assert shared.lm_heads is None
    assert torch.equal(shared(out.hidden[target.num_layers], target.lm_head)[1], out.logits)


def test_blocks_are_zero_initialised_and_independent():
    heads = MedusaHeads(MedusaConfig(hidden_size=8, vocab_size=16, num_heads=3, num_layers=2))
    linears = [block.linear for seq in heads.blocks for block in seq]
    assert len(linears) == 6 and len({id(lin) for lin in linears}) == 6
    assert len({lin.weight.data_ptr() for lin in linears}) == 6
    assert all(torch.count_nonzero(lin.weight) == 0 and torch.count_nonzero(lin.bias) == 0 for lin in linears)
    projections = list(heads.lm_heads)
    assert len({p.weight.data_ptr() for p in projections}) == 3
    with torch.no_grad():
        linears[0].weight.fill_(1.0)
    assert all(torch.count_nonzero(lin.weight) == 0 for lin in linears[1:])


def test_shared_lm_head_needs_the_targets():
    heads = MedusaHeads(MedusaConfig(hidden_size=8, vocab_size=16, num_heads=2, share_lm_head=True))
    with pytest.raises(ValueError, match="share the target's lm_head"):
        heads(torch.zeros(1, 2, 8))


def test_init_from_a_mis_shaped_lm_head_is_a_clear_error():
    heads = MedusaHeads(MedusaConfig(hidden_size=8, vocab_size=16))
    with pytest.raises(ValueError, match=r"target lm_head is \(32, 8\), heads expect \(16, 8\)"):
        heads.init_lm_heads_from(torch.nn.Linear(8, 32, bias=False))


@pytest.mark.parametrize("bad", [{"num_heads": 0}, {"hidden_size": -1}])
def test_config_values_are_checked(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        MedusaConfig(**{"hidden_size": 8, "vocab_size": 16, **bad})


def perturbed(heads: MedusaHeads, seed: int = 0) -> MedusaHeads:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return heads


def test_checkpoint_round_trip_is_bit_equal(tmp_path, tokenizer):
    target = FrozenTarget(tiny_model("qwen2"), tokenizer, name_or_path="tiny-qwen2")
    heads = perturbed(fresh_heads(target, num_heads=3, num_layers=2))
    save_heads(heads, tmp_path / "h", target.record(), {"decay": 0.8, "lr": 1e-3})
    loaded, config = load_heads(tmp_path / "h", target, methods=methods())
    hidden = torch.randn(2, 5, target.hidden_size)
    assert torch.equal(loaded(hidden), heads(hidden))
    assert config["method"] == "medusa" and config["training"]["decay"] == 0.8
    assert config["head_config"] == heads.config.to_dict()
    assert config["target"] == target.record().to_dict()
    assert config["specheads_version"]


def test_loading_against_another_target_is_a_clear_error(tmp_path, tokenizer):
    target = FrozenTarget(tiny_model("llama"), tokenizer, name_or_path="tiny-llama")
    save_heads(fresh_heads(target), tmp_path / "h", target.record())
    wider = FrozenTarget(tiny_model("llama", hidden_size=96), tokenizer, name_or_path="wide-llama")
    with pytest.raises(TargetMismatchError, match="hidden_size: heads in .* trained for 64, target has 96"):
        load_heads(tmp_path / "h", wider, methods=methods())
    other_family = FrozenTarget(tiny_model("mistral"), tokenizer)
    with pytest.raises(TargetMismatchError, match="model_type"):
        load_heads(tmp_path / "h", other_family, methods=methods())


def test_save_writes_config_last_and_keeps_other_files(tmp_path, tokenizer, monkeypatch):
    target = FrozenTarget(tiny_model("llama"), tokenizer)
    heads = fresh_heads(target, num_heads=2)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    save_heads(heads, tmp_path, target.record())
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"
    assert {p.name for p in tmp_path.iterdir()} == {"metrics.jsonl", CONFIG_FILE, WEIGHTS_FILE}

    import specheads.heads.checkpoint as ckpt

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_heads(heads, tmp_path, target.record())
    # The old config is gone before the new weights are written: never a mismatched pair.
    with pytest.raises(FileNotFoundError, match="not a specheads head checkpoint"):
        load_heads(tmp_path, methods=methods())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_loading_something_else_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a specheads head checkpoint"):
        load_heads(tmp_path, methods=methods())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"format": "specheads", "method": "hydra"}))
    (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(ValueError, match="unknown method 'hydra'"):
        load_heads(tmp_path, methods=methods())
