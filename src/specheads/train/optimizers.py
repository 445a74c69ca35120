"""The heads' optimizer: AdamW, or Muon on the heads' hidden matrices with AdamW on the rest.

Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"; `torch.optim.Muon`) replaces a weight
matrix's momentum-averaged gradient by the nearest semi-orthogonal matrix (five Newton-Schulz steps)
before it updates the weight. It is made for hidden 2-D weights only: the projections onto the vocabulary
(the heads' lm_head), embeddings, norm gains and biases stay with AdamW, as its authors and Moonlight
(Liu et al. 2025) train them. `adjust_lr_fn="match_rms_adamw"` (Moonlight's) scales each matrix's update
to the RMS an AdamW update has, 0.2 * sqrt(max(rows, columns)) times the rate, so one schedule drives both
and `muon_lr_scale` says how much larger Muon's step is than AdamW's.

Why here: at the bench's SmolLM2 EAGLE-3 budget it is the one change found that raises τ beyond the
peers' (benchmarks/records/eagle3-smollm2/2026-11-28-ideas/), best near 8x the recipe's lr. Its Newton-Schulz
products run in torch's bf16 wherever bf16 products are fast, else in fp32 (`newton_schulz_dtype`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch
from torch import nn

from specheads.core.machine import CPUINFO, cpuinfo_field

OPTIMIZERS = ("adamw", "muon")
MUON_DTYPES = ("auto", "float32", "bfloat16")  # the Newton-Schulz products' (newton_schulz_dtype)


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Whether Muon updates `param`: a 2-D weight that maps hidden states to hidden states. Not the
    vocabulary's projections (Medusa's `lm_heads.k`, EAGLE-3's `lm_head`) or embeddings: their rows are
    tokens, and each row's own scale matters, which orthogonalising the whole matrix would erase."""
    return param.ndim == 2 and "lm_head" not in name and "embed" not in name


def build_optimizer(
    model: nn.Module,
    optimizer: str,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    muon_lr_scale: float,
    muon_dtype: str = "auto",
) -> torch.optim.Optimizer:
    """The optimizer of `model`'s trainable parameters: `optimizer` "adamw" (every parameter), or "muon"
    (Muon at `muon_lr_scale * lr` on the hidden matrices, its products in `muon_dtype`, AdamW at `lr` on the
    rest)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if optimizer == "adamw":
        return torch.optim.AdamW([p for _, p in trainable], lr=lr, betas=betas, weight_decay=weight_decay)
    if optimizer != "muon":
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    matrices = [p for n, p in trainable if is_hidden_matrix(n, p)]
    if not matrices:
        raise ValueError(
            "optimizer 'muon' found no hidden matrices to train in the heads (only "
            f"{', '.join(n for n, _ in trainable)}): use optimizer 'adamw'"
        )
    others = [p for n, p in trainable if not is_hidden_matrix(n, p)]
    return MuonWithAdamW(matrices, others, lr, muon_lr_scale * lr, betas, weight_decay, muon_dtype)


def muon_missing() -> str:
    """Why this torch cannot run Muon, naming the version that can ("" when it can)."""
    if hasattr(torch.optim, "Muon"):
        return ""
    return (
        f"optimizer 'muon' needs torch.optim.Muon (torch >= 2.9); this torch is {torch.__version__}: "
        "upgrade torch, or use optimizer 'adamw'"
    )


def check_muon_available() -> None:
    if muon_missing():
        raise ValueError(muon_missing())


@functools.cache
def cpu_multiplies_bf16(cpuinfo: str = CPUINFO) -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX-BF16, as Linux's `cpuinfo` lists
    them), with which oneDNN multiplies bf16 faster than fp32; False where it cannot tell."""
    return bool({"avx512_bf16", "amx_bf16"} & set((cpuinfo_field("flags", cpuinfo) or "").split()))


def newton_schulz_dtype(device: torch.device, setting: str = "auto") -> torch.dtype:
    """The dtype Muon's Newton-Schulz products run in on `device`. `setting` "float32" or "bfloat16" is that
    dtype; "auto" is torch's bf16 wherever bf16 products are fast (an accelerator, or a CPU with bf16 matrix
    instructions: on a 2-core AMD EPYC Zen 5 with AVX512-BF16 one iteration on 576 x 1536 took 8.4 ms
    against fp32's 42), else fp32: a CPU without them (AVX2) multiplies bf16 15 to 80 times slower than
    fp32 (measured on another 2-core AMD EPYC: one iteration on 1536 x 576, 15 s against 0.18 s)."""
    if setting not in MUON_DTYPES:
        raise ValueError(f"muon_dtype must be one of {MUON_DTYPES}, got {setting!r}")
    if setting != "auto":
        return getattr(torch, setting)
    return torch.bfloat16 if device.type != "cpu" or cpu_multiplies_bf16() else torch.float32


def orthogonalised(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float):
    """torch.optim.Muon's quintic Newton-Schulz iteration (Jordan et al.) in fp32: (m, n) -> about U V^T of
    update's SVD U S V^T (each singular value brought into roughly [0.5, 1.5], not exactly to 1)."""
    a, b, c = coefficients
    x = update.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T  # the Gram matrix of the shorter side
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


# torch.optim.Muon is torch >= 2.9's: on an older torch this class stands on Optimizer and is never built
# (MuonWithAdamW checks first), so that importing the module, as every recipe does, still works there
class Muon(getattr(torch.optim, "Muon", torch.optim.Optimizer)):
    """torch's Muon (its settings, state and checks), with the Newton-Schulz iteration in
    `newton_schulz_dtype(device, ns_dtype)` of the weights' device: torch's own step where that is bf16,
    the same update with fp32 products where it is fp32. Only `adjust_lr_fn="match_rms_adamw"`: the step is
    0.2 sqrt(max(m, n)) lr."""

    def __init__(self, params, *args, ns_dtype: str = "auto", **kwargs):
        newton_schulz_dtype(torch.device("cpu"), ns_dtype)  # a bad name fails here, before any step
        self.ns_dtype = ns_dtype
        super().__init__(params, *args, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        devices = {p.device for group in self.param_groups for p in group["params"]}
        if all(newton_schulz_dtype(d, self.ns_dtype) == torch.bfloat16 for d in devices):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["adjust_lr_fn"] != "match_rms_adamw":
                raise ValueError(
                    f"Muon here scales its step as 'match_rms_adamw', not {group['adjust_lr_fn']!r}"
                )
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalised(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * 0.2 * math.sqrt(max(p.shape)))
        return loss


class MuonWithAdamW(torch.optim.Optimizer):
    """torch's Muon over `matrices` and AdamW over `others`, seen as one optimizer.

    Its param_groups are the two optimizers' own group dicts (AdamW's, then Muon's), so an lr scheduler
    that scales each group's lr, clipping, and accelerate's wrapper reach both. state_dict() holds both
    states, and load_state_dict() rebinds the groups: loading replaces the two optimizers' group dicts
    (accelerate's prepare() loads the state once, to move it to the device), and a scheduler driving
    the old dicts would leave the rates where they started.
    """

    def __init__(
        self,
        matrices: Iterable[torch.Tensor],
        others: Iterable[torch.Tensor],
        lr: float,
        muon_lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        muon_dtype: str = "auto",
    ):
        check_muon_available()
        matrices, others = list(matrices), list(others)
        # AdamW's groups first: a train log's "lr" is the first group's, the recipe's lr as scheduled
        self.parts = (
            [torch.optim.AdamW(others, lr=lr, betas=betas, weight_decay=weight_decay)] if others else []
        )
        self.parts.append(
            Muon(
                matrices,
                lr=muon_lr,
                weight_decay=weight_decay,
                adjust_lr_fn="match_rms_adamw",
                ns_dtype=muon_dtype,
            )
        )
        super().__init__(matrices + others, {"lr": lr})  # the base class's hooks; its groups are replaced
        self._bind()

    def _bind(self) -> None:
        self.param_groups = [group for part in self.parts for group in part.param_groups]

    @property
    def state(self) -> dict:
        """Both optimizers' per-parameter state (read-only: each keeps its own)."""
        return {p: s for part in self.parts for p, s in part.state.items()}

    @state.setter
    def state(self, value) -> None:
        pass  # the base class's __init__ sets an empty state; the two optimizers hold the real one

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def state_dict(self) -> dict:
        return {"optimizers": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers") if isinstance(state_dict, dict) else None
        if saved is None or len(saved) != len(self.parts):
            raise ValueError(
                f"this optimizer state is not an AdamW + Muon state of {len(self.parts)} parts (was the "
                "checkpoint written with another optimizer?)"
            )
        for part, part_state in zip(self.parts, saved, strict=True):
            part.load_state_dict(part_state)
        self._bind()
