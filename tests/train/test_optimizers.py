"""The heads' optimizer: AdamW, or Muon on the hidden matrices with AdamW on the rest (train/optimizers.py)."""

import types

import pytest
import torch
from accelerate.utils import DistributedType

from specheads.methods import method_named, methods
from specheads.train import optimizers
from specheads.train.distributed import check_optimizer_layout
from specheads.train.loop import build_objective
from specheads.train.optimizers import MuonWithAdamW, build_optimizer
from specheads.train.prepare import build_heads, load_target, lr_lambda
from specheads.train.recipe import load_config

pytestmark = pytest.mark.usefixtures("one_thread")


def objective(method: str, target_dir, **overrides):
    cfg = load_config(
        None,
        {"method": method, "target": str(target_dir), "report_to": "none", **overrides},
        methods=methods(),
    )
    target = load_target(cfg, str(target_dir), torch.device("cpu"))
    heads, _ = build_heads(cfg, method_named(method), target, label_counts=torch.ones(target.vocab_size))
    model, optimizer, _ = build_objective(cfg, method_named(method), target, heads)
    return cfg, model, optimizer


def names_by_part(model, optimizer: MuonWithAdamW) -> dict[str, list[str]]:
    name_of = {id(p): n.removeprefix("heads.") for n, p in model.named_parameters()}
    return {
        type(part).__name__: sorted(name_of[id(p)] for g in part.param_groups for p in g["params"])
        for part in optimizer.parts
    }


@pytest.mark.parametrize(
    "method, overrides, muon, adamw",
    [
        (
            "medusa",
            {"num_heads": 2},
            ["blocks.0.0.linear.weight", "blocks.1.0.linear.weight"],
            ["blocks.0.0.linear.bias", "blocks.1.0.linear.bias", "lm_heads.0.weight", "lm_heads.1.weight"],
        ),
        (
            "eagle",
            {},
            ["fc.weight"]
            + [f"layers.0.mlp.{m}_proj.weight" for m in ("down", "gate", "up")]
            + [f"layers.0.self_attn.{m}_proj.weight" for m in ("k", "o", "q", "v")],
            ["fc.bias", "layers.0.post_attention_layernorm.weight"],
        ),
        (
            "eagle3",
            {"draft_vocab_size": 100},
            ["fc.weight"]
            + [f"midlayer.mlp.{m}_proj.weight" for m in ("down", "gate", "up")]
            + [f"midlayer.self_attn.{m}_proj.weight" for m in ("k", "o", "q", "v")],
            ["lm_head.weight"]
            + [f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")]
            + ["norm.weight"],
        ),
    ],
    ids=["medusa", "eagle", "eagle3"],
)
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(method, overrides, muon, adamw, tiny_target_dirs):
    """The vocabulary projections, norms and biases stay with AdamW; every trainable weight is in one part."""
    cfg, model, optimizer = objective(method, tiny_target_dirs["llama"], optimizer="muon", **overrides)
    assert isinstance(optimizer, MuonWithAdamW)
    assert names_by_part(model, optimizer) == {"AdamW": sorted(adamw), "Muon": sorted(muon)}
    rates = [g["lr"] for g in optimizer.param_groups]
    assert rates == [
        cfg.lr,
        cfg.lr * cfg.muon_lr_scale,
    ]  # AdamW's group first: the logged "lr" is the recipe's
    _, _, plain = objective(method, tiny_target_dirs["llama"], **overrides)
    assert type(plain) is torch.optim.AdamW  # the default is unchanged


def toy_params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((6, 4), (5, 6), (6,), (9, 4))]


def set_grads(params, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def three_steps(combined, muon, adamw, ours, ref) -> None:
    for step in range(3):
        set_grads(ours, step), set_grads(ref, step)
        combined.step(), muon.step(), adamw.step()
        combined.zero_grad(), muon.zero_grad(), adamw.zero_grad()


def torchs_pair(ref):
    muon = torch.optim.Muon(ref[:2], lr=3e-2, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    return muon, torch.optim.AdamW(ref[2:], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01)


def test_where_bf16_is_fast_a_step_is_torchs_muon_on_the_matrices_and_adamw_on_the_rest(monkeypatch):
    """Where bf16 products are fast (an accelerator, or a CPU with bf16 matrix instructions: here the CPU made
    to count as one), Muon's step under muon_dtype "auto" is torch's own, bit for bit."""
    monkeypatch.setattr(optimizers, "cpu_multiplies_bf16", lambda: True)
    assert optimizers.newton_schulz_dtype(torch.device("cpu")) == torch.bfloat16
    ours, ref = toy_params(), toy_params()
    combined = MuonWithAdamW(ours[:2], ours[2:], lr=1e-2, muon_lr=3e-2, betas=(0.9, 0.95), weight_decay=0.01)
    three_steps(combined, *torchs_pair(ref), ours, ref)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
    assert all(p.grad is None for p in ours)
    assert set(combined.state) == set(ours)  # both parts' state, one entry a parameter


@pytest.mark.parametrize("bf16_cpu, setting", [(False, "auto"), (True, "float32")])
def test_on_a_cpu_without_bf16_units_muon_is_torchs_update_with_fp32_products(monkeypatch, bf16_cpu, setting):
    """The same three steps on a CPU without bf16 matrix instructions (15-80x slower in bf16 there), or on any
    CPU with muon_dtype "float32": the Newton-Schulz products in fp32 rather than torch's bf16, AdamW's part
    equal, Muon's within bf16's rounding of torch's, 3% of how far the weights moved."""
    monkeypatch.setattr(optimizers, "cpu_multiplies_bf16", lambda: bf16_cpu)
    assert optimizers.newton_schulz_dtype(torch.device("cpu"), setting) == torch.float32
    start, ours, ref = toy_params(), toy_params(), toy_params()
    combined = MuonWithAdamW(
        ours[:2], ours[2:], lr=1e-2, muon_lr=3e-2, betas=(0.9, 0.95), weight_decay=0.01, muon_dtype=setting
    )
    three_steps(combined, *torchs_pair(ref), ours, ref)
    assert all(torch.equal(a, b) for a, b in zip(ours[2:], ref[2:], strict=True))
    for a, b, s in zip(ours[:2], ref[:2], start[:2], strict=True):
        moved = (b - s).abs().max().item()
        assert moved > 0.02 and (a - b).abs().max().item() < 0.03 * moved, ((a - b).abs().max().item(), moved)


def test_muon_dtype_bfloat16_is_torchs_step_on_any_cpu_and_a_bad_name_is_refused(monkeypatch):
    monkeypatch.setattr(optimizers, "cpu_multiplies_bf16", lambda: False)
    ours, ref = toy_params(), toy_params()
    combined = MuonWithAdamW(
        ours[:2], ours[2:], lr=1e-2, muon_lr=3e-2, betas=(0.9, 0.95), weight_decay=0.01, muon_dtype="bfloat16"
    )
    three_steps(combined, *torchs_pair(ref), ours, ref)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
    with pytest.raises(
        ValueError, match="muon_dtype must be one of \\('auto', 'float32', 'bfloat16'\\), got 'fp16'"
    ):
        MuonWithAdamW(ours[:2], ours[2:], 1e-3, 1e-3, (0.9, 0.999), 0.0, muon_dtype="fp16")
    with pytest.raises(ValueError, match="muon_dtype must be one of .*got 'fp16'"):
        load_config(None, ["optimizer=muon", "muon_dtype=fp16"], methods=methods())


@pytest.mark.parametrize(
    "flags, fast",
    [
        ("fpu avx2 avx512f avx512_bf16 avx512vl", True),  # AMD Zen 4 / 5, Intel Cooper Lake
        ("fpu avx2 avx512f amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
        ("fpu avx2 avx512f avx512bw", False),  # AVX-512 without bf16 (Skylake-SP, Ice Lake)
        ("fpu avx2 fma", False),
        (None, False),  # no /proc/cpuinfo (macOS, Windows)
    ],
)
def test_bf16_matrix_instructions_are_read_from_the_cpu_flags(tmp_path, flags, fast):
    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert optimizers.cpu_multiplies_bf16(str(cpuinfo)) is fast


def test_the_fp32_iteration_brings_every_singular_value_near_one_as_torchs():
    """orthogonalised(G) ~ U V^T for G = U S V^T, whose singular values span 1e-3 to 1: each lands in
    torch's (bf16) range, wide or tall."""
    coefficients = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults["ns_coefficients"]
    for shape in ((64, 192), (128, 64)):
        g = torch.randn(shape, generator=torch.Generator().manual_seed(0)) @ torch.diag(
            torch.logspace(-3, 0, shape[1])
        )
        values = torch.linalg.svdvals(optimizers.orthogonalised(g, coefficients, 5, 1e-7))
        assert values.min() > 0.15 and values.max() < 1.25, (shape, values.min(), values.max())


def run(params, optimizer, scheduler, steps: range) -> None:
    for step in steps:
        set_grads(params, step)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def test_the_schedule_drives_both_parts_and_a_saved_state_resumes_exactly():
    """A scheduler reaches both optimizers' rates, also after load_state_dict (accelerate's prepare()
    loads the state once: the groups must be rebound, or the rates would stay where they started),
    and a run resumed from the state after 3 of 6 steps ends bit-identical to the run straight through."""
    cfg = load_config(None, ["optimizer=muon", "lr=0.01", "warmup_steps=2", "max_steps=6"], methods=methods())

    def fresh():
        params = toy_params()
        optimizer = MuonWithAdamW(
            params[:2], params[2:], cfg.lr, cfg.lr * cfg.muon_lr_scale, (0.9, 0.999), 0.0
        )
        optimizer.load_state_dict(optimizer.state_dict())  # as accelerate's prepare() does
        return params, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_lambda(s, cfg))

    straight, opt, sched = fresh()
    run(straight, opt, sched, range(6))
    factor = lr_lambda(6, cfg)
    assert [g["lr"] for part in opt.parts for g in part.param_groups] == pytest.approx(
        [cfg.lr * factor, cfg.lr * cfg.muon_lr_scale * factor]
    )
    first, opt, sched = fresh()
    run(first, opt, sched, range(3))
    saved = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
    saved_weights = [p.detach().clone() for p in first]
    resumed, opt, sched = fresh()
    with torch.no_grad():
        for p, w in zip(resumed, saved_weights, strict=True):
            p.copy_(w)
    opt.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["scheduler"])
    run(resumed, opt, sched, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))


def test_an_adamw_state_is_refused_by_name():
    params = toy_params()
    combined = MuonWithAdamW(params[:2], params[2:], 1e-3, 1e-3, (0.9, 0.999), 0.0)
    with pytest.raises(ValueError, match="not an AdamW \\+ Muon state of 2 parts"):
        combined.load_state_dict(torch.optim.AdamW(params).state_dict())


def test_heads_without_hidden_matrices_are_refused_naming_them():
    model = torch.nn.Module()
    model.lm_head = torch.nn.Linear(4, 9, bias=False)
    with pytest.raises(
        ValueError, match="found no hidden matrices to train in the heads \\(only lm_head.weight\\)"
    ):
        build_optimizer(model, "muon", 1e-3, (0.9, 0.999), 0.0, muon_lr_scale=8.0)


def test_a_torch_without_muon_is_named(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    message = "needs torch.optim.Muon \\(torch >= 2.9\\); this torch is 2.8.0"
    with pytest.raises(ValueError, match=message):  # from the recipe, before a target or data is loaded
        load_config(None, ["optimizer=muon"], methods=methods())
    with pytest.raises(ValueError, match=message):
        optimizers.check_muon_available()
    load_config(None, ["optimizer=adamw"], methods=methods())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optimizer=sgd"], r"optimizer must be one of \('adamw', 'muon'\), got 'sgd'"),
        (["optimizer=muon", "muon_lr_scale=0"], "muon_lr_scale must be > 0"),
        (
            ["method=medusa2", "optimizer=muon"],
            "method 'medusa2' builds its own optimizer .*optimizer 'muon' is not available for it, use 'adamw'",
        ),
    ],
)
def test_bad_optimizer_settings_are_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides, methods=methods())


@pytest.mark.parametrize(
    "layout, name", [(DistributedType.DEEPSPEED, "DeepSpeed"), (DistributedType.FSDP, "FSDP")]
)
def test_muon_is_refused_where_the_matrices_are_split_over_processes(layout, name):
    accelerator = types.SimpleNamespace(distributed_type=layout)
    with pytest.raises(
        ValueError, match=f"optimizer 'muon' cannot run under {name}.*recipes/accelerate/ddp.yaml"
    ):
        check_optimizer_layout(accelerator, "muon")
    check_optimizer_layout(accelerator, "adamw")  # AdamW runs there
    check_optimizer_layout(types.SimpleNamespace(distributed_type=DistributedType.MULTI_CPU), "muon")  # DDP
