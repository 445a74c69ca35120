"""Medusa-2 on a tiny llama: only heads and LoRA weights train, the teacher is the un-adapted model,
the saved adapter is a standard peft adapter that reproduces the adapted logits, λ0 is pinned."""

import copy
import json
import math

import pytest
import torch
from safetensors import safe_open

from specheads.heads import FrozenTarget, MedusaConfig, MedusaHeads
from specheads.train.data import collate, load_rows, tokenize_rows
from specheads.train.medusa2 import (
    Medusa2WithLoss,
    adapter_parameters,
    lambda0,
    load_adapter,
    medusa2_loss,
    param_groups,
    save_adapter,
    teacher_logits,
    wrap_target_with_lora,
)

from helpers import tiny_model, tiny_tokenizer


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batch(text_data):
    tokenizer = tiny_tokenizer()
    rows = tokenize_rows(load_rows(str(text_data)), tokenizer, max_length=32, loss_on="all")
    return collate(
        [rows[i] for i in range(4)], pad_token_id=tokenizer.pad_token_id, packing=False, max_length=32
    )


def fresh_target() -> FrozenTarget:
    tokenizer = tiny_tokenizer()
    return FrozenTarget(
        tiny_model("llama", seed=0, vocab_size=len(tokenizer)), tokenizer, name_or_path="tiny-llama"
    )


def logits_of(target: FrozenTarget, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return target(
            batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits


@pytest.fixture(scope="module")
def trained(batch):
    """A Medusa-2 run of 4 optimizer steps; returns what the tests inspect."""
    target = fresh_target()
    original = copy.deepcopy(target.model)
    wrapped = wrap_target_with_lora(target, r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=wrapped.vocab_size, num_heads=2))
    heads.init_lm_heads_from(wrapped.lm_head)
    base_before = {n: p.detach().clone() for n, p in wrapped.model.named_parameters() if ".lora_" not in n}
    adapter_before = {n: p.detach().clone() for n, p in adapter_parameters(wrapped)}
    heads_before = {n: p.detach().clone() for n, p in heads.named_parameters()}
    groups = param_groups(heads, wrapped, lr_heads=1e-2, lr_adapter=1e-3)
    optimizer = torch.optim.AdamW(groups)
    parts, grads_seen = [], set()
    for step in range(4):
        loss, metrics, part = medusa2_loss(heads, wrapped, batch, lambda0=lambda0(step + 1, 4, peak=0.5))
        loss.backward()
        parts.append(part)
        grads_seen |= {n for n, p in wrapped.model.named_parameters() if p.grad is not None}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "wrapped": wrapped,
        "original": original,
        "heads": heads,
        "groups": groups,
        "parts": parts,
        "metrics": metrics,
        "grads_seen": grads_seen,
        "before": (base_before, adapter_before, heads_before),
    }


def test_only_heads_and_adapters_train(trained):
    wrapped, heads = trained["wrapped"], trained["heads"]
    base_before, adapter_before, heads_before = trained["before"]
    adapter_names = set(adapter_before)
    assert len(adapter_names) == 4 * 3 * 2  # 4 layers x (q, v, down) x (A, B)
    assert trained["grads_seen"] == adapter_names  # no base weight ever got a gradient
    for name, p in wrapped.model.named_parameters():
        if name in adapter_names:
            assert p.requires_grad and not torch.equal(p, adapter_before[name]), name
        else:
            assert not p.requires_grad and torch.equal(p, base_before[name]), name
    assert all(not torch.equal(p, heads_before[n]) for n, p in heads.named_parameters())
    names = [g["name"] for g in trained["groups"]]
    lrs = [g["lr"] for g in trained["groups"]]
    assert names == ["heads", "adapter"] and lrs == [1e-2, 1e-3]
    in_groups = {id(p) for g in trained["groups"] for p in g["params"]}
    expected = {id(p) for p in heads.parameters()} | {id(p) for _, p in adapter_parameters(wrapped)}
    assert in_groups == expected
    # B starts at zero: the adapted target starts equal to the original, then moves off it.
    kls = [p["target_kl"] for p in trained["parts"]]
    assert kls[0] == 0.0 and kls[-1] > 0
    assert [p["lambda0"] for p in trained["parts"]] == [lambda0(s, 4, peak=0.5) for s in (1, 2, 3, 4)]
    assert trained["metrics"].count[0] > 0


def test_teacher_is_the_unadapted_model(trained, batch):
    wrapped = trained["wrapped"]
    teacher = teacher_logits(wrapped, batch)
    original = trained["original"](
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits
    torch.testing.assert_close(teacher, original, rtol=0, atol=0)
    assert (logits_of(wrapped, batch) - teacher).abs().max() > 1e-4  # the adapters are on outside it


def test_saved_adapter_reproduces_adapted_logits(trained, batch, tmp_path):
    from peft import PeftModel

    wrapped = trained["wrapped"]
    path = save_adapter(wrapped, tmp_path / "heads")
    assert path == tmp_path / "heads" / "adapter"
    assert sorted(p.name for p in path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == "tiny-llama"
    with safe_open(str(path / "adapter_model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert len(keys) == 24 and all(".lora_A." in k or ".lora_B." in k for k in keys)

    adapted = logits_of(wrapped, batch)
    base = tiny_model("llama", seed=0, vocab_size=len(tiny_tokenizer()))  # a fresh copy of the base
    restored = FrozenTarget(PeftModel.from_pretrained(base, str(path)), tiny_tokenizer())
    torch.testing.assert_close(logits_of(restored, batch), adapted, rtol=0, atol=1e-6)
    merged = load_adapter(fresh_target(), path, merge=True)
    assert not any(".lora_" in n for n, _ in merged.model.named_parameters())
    torch.testing.assert_close(logits_of(merged, batch), adapted, rtol=1e-4, atol=1e-4)


def test_lambda0_schedule_pinned():
    assert lambda0(0, 100) == 0.0
    assert lambda0(50, 100) == pytest.approx(0.2 * math.sqrt(0.5), abs=1e-15)  # 0.2 sin(π/4)
    assert lambda0(100, 100) == pytest.approx(0.2) and lambda0(150, 100) == pytest.approx(0.2)
    assert lambda0(25, 100, schedule="linear") == pytest.approx(0.05)
    assert lambda0(25, 100, warmup=0.5) == pytest.approx(0.2 * math.sqrt(0.5))
    assert lambda0(50, 100, warmup=0.5) == pytest.approx(0.2) == lambda0(80, 100, warmup=0.5)
    assert lambda0(0, 100, schedule="constant", peak=1.0) == 1.0
    assert [round(lambda0(s, 4, peak=0.5), 6) for s in range(5)] == [0.0, 0.191342, 0.353553, 0.46194, 0.5]
    with pytest.raises(ValueError, match="unknown λ0 schedule 'cosine'"):
        lambda0(1, 10, schedule="cosine")


def test_bad_lora_settings_are_errors(batch):
    target = fresh_target()
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] are not linear layers of LlamaForCausalLM"):
        wrap_target_with_lora(target, target_modules=("q_proj", "qkv_proj"))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=target.vocab_size, num_heads=1))
    with pytest.raises(TypeError, match="wrap_target_with_lora"):
        param_groups(heads, target, 1e-3, 1e-4)
    with pytest.raises(TypeError, match="wrap_target_with_lora"):
        medusa2_loss(heads, target, batch, lambda0=0.1)


def test_module_form_trains_only_heads_and_adapters(batch):
    wrapped = wrap_target_with_lora(fresh_target(), r=2, alpha=4, target_modules=("o_proj",))
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=wrapped.vocab_size, num_heads=2))
    model = Medusa2WithLoss(heads, wrapped, decay=0.8, topk=3)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for g in param_groups(heads, wrapped, 1.0, 1.0) for p in g["params"]}
    loss, metrics = model(batch, 0.3)
    expected, head_metrics, _ = medusa2_loss(heads, wrapped, batch, lambda0=0.3, decay=0.8, topk=3)
    assert loss.item() == expected.item() and torch.equal(metrics, head_metrics.as_tensor())
    assert metrics.shape == (4, 2) and metrics[3, 0] > 0
    short = {k: v[:, :2] for k, v in batch.items()}  # no head has a label: every head still in the graph
    model(short, 0.3)[0].backward()
    assert all(p.grad is not None for p in heads.parameters())
