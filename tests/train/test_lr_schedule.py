"""The learning-rate schedule (warm-up, then cosine or linear decay), the data order's seed, and AdamW's beta2."""

import re
from itertools import islice
from types import SimpleNamespace

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.methods import methods
from specheads.train.config import TrainConfig
from specheads.train.loop import build_objective
from specheads.train.prepare import lr_lambda, train_batches
from specheads.train.recipe import load_config

from helpers import tiny_model


def factors(cfg: TrainConfig) -> list[float]:
    return [lr_lambda(step, cfg) for step in range(cfg.max_steps)]


def test_defaults_are_cosine_and_the_seed_orders_the_data():
    cfg = TrainConfig()
    assert (cfg.lr_schedule, cfg.data_seed) == ("cosine", -1)


def test_cosine_warms_up_then_decays_to_a_tenth():
    cfg = load_config(None, ["warmup_steps=4", "max_steps=20"], methods=methods())
    f = factors(cfg)
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4] == pytest.approx(1.0) and lr_lambda(20, cfg) == pytest.approx(0.1)
    assert f[12] == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
    assert all(a >= b for a, b in zip(f[3:], f[4:]))


def test_linear_decays_to_zero_as_the_hf_trainers_linear():
    """After the warm-up, the HF Trainer's `linear` (get_linear_schedule_with_warmup), step for step."""
    from transformers import get_linear_schedule_with_warmup

    cfg = load_config(None, ["lr_schedule=linear", "warmup_steps=24", "max_steps=240"], methods=methods())
    f = factors(cfg)
    # the same warm-up
    assert f[:24] == factors(load_config(None, ["warmup_steps=24", "max_steps=240"], methods=methods()))[:24]
    assert f[24] == 1.0 and f[132] == pytest.approx(0.5) and lr_lambda(240, cfg) == 0.0
    hf = get_linear_schedule_with_warmup(torch.optim.SGD([torch.zeros(1)], lr=1.0), 24, 240).lr_lambdas[0]
    assert f[24:] == pytest.approx([hf(step) for step in range(24, 240)])


def order(cfg: TrainConfig, batches: int = 6) -> list[list[int]]:
    rows = [{"i": i} for i in range(10)]
    one = SimpleNamespace(num_processes=1, process_index=0, device="cpu")
    collate = lambda b: {"i": torch.tensor([r["i"] for r in b])}  # noqa: E731
    return [b["i"].tolist() for b in islice(train_batches(cfg, rows, collate, one, start=0), batches)]


def test_data_seed_orders_the_rows_apart_from_seed():
    seeded = order(load_config(None, ["batch_size=3", "seed=1"], methods=methods()))
    assert order(load_config(None, ["batch_size=3", "seed=5", "data_seed=1"], methods=methods())) == seeded
    assert order(load_config(None, ["batch_size=3", "seed=1", "data_seed=2"], methods=methods())) != seeded


@pytest.mark.parametrize("method", ["medusa", "medusa2"])
def test_adam_beta2_reaches_the_optimizer(method):
    """adam_beta2 (default PyTorch's and the HF Trainer's 0.999; EAGLE's main.py 0.95) is the AdamW the loop
    steps with, for the plain objective and Medusa-2's own; a value outside [0, 1) is refused by name."""
    for overrides, betas in (([], (0.9, 0.999)), (["adam_beta2=0.95"], (0.9, 0.95))):
        target = FrozenTarget(tiny_model("llama", vocab_size=264))
        cfg = load_config(None, [f"method={method}", *overrides], methods=methods())
        entry = methods()[cfg.method]
        heads, _ = entry.build_heads(cfg, target, None)
        _, optimizer, _ = build_objective(cfg, entry, target, heads)
        assert {g["betas"] for g in optimizer.param_groups} == {betas}
    with pytest.raises(ValueError, match="adam_beta2 must be in"):
        load_config(None, ["adam_beta2=1.0"], methods=methods())


def test_warmup_ratio_counts_its_steps_as_the_hf_trainer_and_follows_max_steps():
    """warmup_ratio: ceil(ratio * max_steps) warm-up steps (HF's get_warmup_steps), so a max_steps= override
    keeps a recipe's tenth; with warmup_steps 0 it is the same schedule as that many warmup_steps."""
    import math

    for steps in (80, 96, 200, 7):
        cfg = load_config(
            None,
            ["lr_schedule=linear", "warmup_steps=0", "warmup_ratio=0.1", f"max_steps={steps}"],
            methods=methods(),
        )
        assert cfg.warmup == math.ceil(0.1 * steps)
        same = load_config(
            None,
            ["lr_schedule=linear", f"warmup_steps={cfg.warmup}", f"max_steps={steps}"],
            methods=methods(),
        )
        assert factors(cfg) == factors(same)
    # the default ratio 0: the steps as given
    assert load_config(None, ["warmup_steps=4"], methods=methods()).warmup == 4


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["warmup_ratio=0.1"], "set warmup_steps or warmup_ratio, not both"),  # the default warmup_steps 50
        (["warmup_steps=0", "warmup_ratio=1.5"], "warmup_ratio must be in [0, 1)"),
        (["warmup_steps=0", "warmup_ratio=-0.1"], "warmup_ratio must be in [0, 1)"),
    ],
)
def test_a_warmup_given_twice_or_out_of_range_is_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        load_config(None, overrides, methods=methods())
