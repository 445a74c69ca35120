"""A half-precision target (target_dtype=bfloat16) under heads trained in fp32 (no mixed_precision): the
target's bf16 hidden states enter every method's heads in the heads' own dtype, so a run trains (Medusa's
heads once failed there: "mat1 and mat2 must have the same dtype")."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specheads.heads.medusa import MedusaConfig, MedusaHeads
from specheads.methods import method_named, methods
from specheads.train import loop
from specheads.train.recipe import load_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "letters.jsonl"
    words = ["abcdefghij", "klmnopqrst", "uvwxyzabcd", "jihgfedcba"]
    path.write_text("".join(json.dumps({"text": (words[i % 4] * 12)[i % 7 :]}) + "\n" for i in range(32)))
    return path


@pytest.mark.parametrize(
    "recipe, extra",
    [
        ("medusa.yaml", ()),
        ("medusa.yaml", ("medusa.share_lm_head=true",)),  # fp32 blocks into the target's bf16 lm_head
        ("medusa2.yaml", ()),
        ("eagle.yaml", ()),
        ("eagle3.yaml", ("eagle3.draft_vocab_size=64",)),
    ],
)
def test_fp32_heads_train_on_a_bf16_target(llama_dir, rows, tmp_path, recipe, extra):
    out = tmp_path / "run"
    cfg = load_config(
        REPO / "recipes" / "tiny" / recipe,
        [
            f"target={llama_dir}",
            f"data={rows}",
            "eval_fraction=0",
            "eval_data=[]",
            "loss_on=all",
            "max_length=64",
            "batch_size=4",
            "max_steps=2",
            "warmup_steps=1",
            "log_every=1",
            "report_to=none",
            f"output_dir={out}",
            "target_dtype=bfloat16",
            *extra,
        ],
        methods=methods(),
    )
    assert cfg.mixed_precision == "no"
    loop.train(cfg, method_named(cfg.method), progress=False)
    assert json.loads((out / "train_summary.json").read_text())["completed"]
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(math.isfinite(v) and v > 0 for v in losses)
    weights = [w for w in load_file(out / "model.safetensors").values() if w.is_floating_point()]
    assert weights and all(
        w.dtype == torch.float32 and w.isfinite().all() for w in weights
    )  # EAGLE-3's maps aside


def test_medusa_head_takes_states_and_a_shared_lm_head_in_another_dtype():
    """A head casts the hidden states to its own dtype and its output to a shared lm_head's; gradients
    reach the fp32 heads."""
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(hidden_size=16, vocab_size=32, num_heads=2, share_lm_head=True))
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.1)
    lm_head = torch.nn.Linear(16, 32, bias=False).to(torch.bfloat16).requires_grad_(False)
    hidden = torch.randn(3, 16, dtype=torch.bfloat16)
    logits = heads.head(1, hidden, lm_head)
    assert logits.shape == (3, 32) and logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    grads = [p.grad for p in heads.blocks[1].parameters()]
    assert all(g is not None and g.dtype == torch.float32 and g.abs().sum() > 0 for g in grads)
    own = MedusaHeads(MedusaConfig(hidden_size=16, vocab_size=32, num_heads=2))
    expected = own.lm_heads[0](own.blocks[0](hidden.float()))
    assert torch.equal(own.head(0, hidden), expected) and own(hidden).dtype == torch.float32
