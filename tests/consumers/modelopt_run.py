"""Train and export EAGLE-3 heads with NVIDIA Model Optimizer's own code (run in the modelopt env).

    python modelopt_run.py TARGET_DIR WORKDIR [STEPS]

Runs with PYTHONPATH at the modelopt directory (tests/consumers/modelopt_env.py: nvidia-modelopt 0.47.0
and the transformers 5.14.1 it supports). It imports nothing of specheads. As modelopt's
examples/speculative_decoding does, on the tiny target TARGET_DIR:

  1. `mtsp.convert(model, [("eagle", config)])` with EAGLE3_DEFAULT_CFG: its EAGLE-3 architecture config
     sized to the target's layer (heads, MLP, head_dim), a 100-token draft vocabulary (its d2t buffer set
     to a sorted sample, as its draft-vocab calibration writes offsets), aux layers (0, 1, 2): its 0-based
     ids of the decoder layers whose outputs it hooks (HF hidden_states 1, 2, 3); modelopt's own default
     for a 4-layer target is [0, 1], two layers. torch.compile off (a CPU run).
  2. STEPS steps of its own training forward (`model(input_ids).loss`, 3 training-time-test steps, the
     frozen base model) under AdamW: a plain loop over its model's loss.
  3. `modelopt.torch.export.export_speculative_decoding(model, export_dir=WORKDIR/eagle3)`, its exporter,
     with `eagle_export_rope_scaling={}` (the draft keeps the rope it trained with), and again with its
     default (WORKDIR/eagle3-default-rope: YaRN factor 32 written into config.json).
  4. Its draft logits on WORKDIR/tokens.pt (1, T+1): its own base forward (aux hooks), `_prepare_eagle_inputs`
     and `_eagle_forward` (one step; position t reads the hooked states at t and the embedding of token
     t+1), positions 0..T-1. Also the same forward with layer 0's `input_layernorm` applied to the token
     embeddings only, which is how vLLM and SGLang read the exported layer (see `EmbedsOnlyNorm`).
  5. With that same reading, its training loss (`model(input_ids).loss` in training mode, no update) on a
     batch of random tokens (`loss_tokens`), to set beside our EAGLE-3 loss on the same weights.

Writes WORKDIR/out.pt: logits, logits_engine_norm (1, T, Vd), target_ids (via its d2t), layer_ids, losses,
loss_tokens, loss_engine_norm ({loss, train_acc}), ttt_steps, loss_decay, and what its EAGLE-1 and Medusa
paths do (`eagle1`, `medusa`: a sentence each).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from torch import nn

LAYER_IDS = [0, 1, 2]
DRAFT_VOCAB = 100
# its training batches' shape: its TTT attention masks are cached per step, not per shape
LOSS_BATCH = (2, 24)


class EmbedsOnlyNorm(nn.Module):
    """Layer 0's input_layernorm as the engines apply it: to the token embeddings only.

    modelopt 0.47.0's EAGLE-3 layer 0 is transformers' LlamaDecoderLayer, whose forward runs
    `input_layernorm` on the fused hidden state before attention; modelopt's attention pre-hook then
    applies `hidden_norm` to that output and `input_layernorm` (the same module) to the embeddings. So
    modelopt computes hidden_norm(input_layernorm(h)); vLLM's and SGLang's llama_eagle3 layers compute
    hidden_norm(h). Per forward the decoder's call comes first (hidden), the pre-hook's second (embeds):
    this passes the first through and normalises the second."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm
        self.calls = 0

    @property
    def weight(self) -> torch.Tensor:  # what modelopt reads of the module besides calling it (its dtype)
        return self.norm.weight

    def forward(self, x):
        self.calls += 1
        return x if self.calls % 2 == 1 else self.norm(x)


def build(target_dir: Path):
    import modelopt.torch.speculative as mtsp
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    c = model.config
    cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG)["config"]
    cfg["eagle_architecture_config"].update(
        {
            "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.hidden_size // c.num_attention_heads,
            "rms_norm_eps": c.rms_norm_eps,
            "torch_dtype": "float32",
            "draft_vocab_size": DRAFT_VOCAB,
            "eagle_aux_hidden_state_layer_ids": LAYER_IDS,
        }
    )
    cfg["eagle_use_torch_compile"] = False
    cfg["eagle_export_rope_scaling"] = {}
    mtsp.convert(model, [("eagle", cfg)])
    draft = (
        torch.randperm(c.vocab_size, generator=torch.Generator().manual_seed(1))[:DRAFT_VOCAB].sort().values
    )
    with torch.no_grad():
        model.eagle_module.d2t.copy_(draft - torch.arange(DRAFT_VOCAB))  # target_id = i + d2t[i]
    return model


def train(model, steps: int) -> list[float]:
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    g = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=g)
        loss = model(input_ids=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return model.eval() and losses


@torch.no_grad()
def training_loss(model, tokens: torch.Tensor) -> dict:
    """modelopt's own training loss (`model(input_ids).loss` in training mode: its training-time-test steps,
    its step decay, every position's label) on `tokens`, no update; and its per-step draft accuracies."""
    model.train()
    try:
        out = model(input_ids=tokens)
    finally:
        model.eval()
    return {"loss": float(out.loss), "train_acc": out.train_acc[0]}


@torch.no_grad()
def draft_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """modelopt's own first draft step over `tokens` (1, T+1): logits (1, T, Vd) at positions 0..T-1."""
    from transformers import DynamicCache

    base, _ = model._eagle_base_model_forward(tokens, None, None, None, True, None)
    cache = DynamicCache(config=model.eagle_module.config)
    embeds, hiddens, mask, positions, _, _ = model._prepare_eagle_inputs(tokens, None, None, cache, base)
    model.eagle_module._maybe_init_rope(device=hiddens.device)
    _, _, logits, _ = model._eagle_forward(hiddens, embeds, mask, positions, cache)
    return logits[:, :-1]  # the last position read the wrapped-around embedding of token 0


def other_paths(target_dir: Path) -> dict:
    """What modelopt 0.47.0's EAGLE-1 (no aux states) and Medusa paths give on the same target."""
    import modelopt.torch.speculative as mtsp
    from modelopt.torch.export import export_speculative_decoding
    from modelopt.torch.speculative.config import eagle3_default_config
    from transformers import AutoModelForCausalLM

    found = {}
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    arch = copy.deepcopy(eagle3_default_config)
    arch.update(
        {
            "use_aux_hidden_state": False,
            "use_last_layernorm": False,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        }
    )
    mtsp.convert(model, [("eagle", {"eagle_architecture_config": arch, "eagle_use_torch_compile": False})])
    keys = sorted(k for k in model.state_dict() if "eagle_module" in k)
    found["eagle1"] = (
        "use_aux_hidden_state=False builds an EagleModule without fc, whose layer reads the target's last "
        "hidden state only (inputs_embeds unused): not EAGLE-1's fc over [embedding; feature]. Its keys: "
        + ", ".join(keys)
    )
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    mtsp.convert(model, [("medusa", {"medusa_num_heads": 2, "medusa_num_layers": 1})])
    try:
        export_speculative_decoding(model, export_dir=str(target_dir.parent / "medusa-export"))
        found["medusa"] = "exported"
    except Exception as e:  # noqa: BLE001 - recorded for the report
        found["medusa"] = f"export_speculative_decoding: {type(e).__name__}: {e}"
    return found


def main(target_dir: str, workdir: str, steps: str = "5") -> None:
    from modelopt.torch.export import export_speculative_decoding

    target_dir, workdir = Path(target_dir), Path(workdir)
    tokens = torch.load(workdir / "tokens.pt", weights_only=True)
    model = build(target_dir)
    losses = train(model, int(steps))
    export_speculative_decoding(model, export_dir=str(workdir / "eagle3"))
    model.eagle_export_rope_scaling = {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 2048,
    }
    export_speculative_decoding(model, export_dir=str(workdir / "eagle3-default-rope"))
    logits = draft_logits(model, tokens)
    d2t = model.eagle_module.d2t
    draft = logits.argmax(-1)
    layer0 = model.eagle_module.layers[0]
    own_norm = layer0.input_layernorm
    layer0.input_layernorm = EmbedsOnlyNorm(own_norm)
    engine_norm = draft_logits(model, tokens)
    loss_tokens = torch.randint(
        0, model.config.vocab_size, LOSS_BATCH, generator=torch.Generator().manual_seed(4)
    )
    loss_engine_norm = training_loss(model, loss_tokens)
    layer0.input_layernorm = own_norm
    out = {
        "logits": logits,
        "logits_engine_norm": engine_norm,
        "target_ids": draft + d2t[draft],
        "layer_ids": list(model.eagle_config.eagle_aux_hidden_state_layer_ids),
        "losses": losses,
        "loss_tokens": loss_tokens,
        "loss_engine_norm": loss_engine_norm,
        "ttt_steps": model.eagle_ttt_steps,
        "loss_decay": model.eagle_loss_decay_factor,
        "input_layernorm_spread": float(own_norm.weight.max() - own_norm.weight.min()),
        **other_paths(target_dir),
    }
    torch.save(out, workdir / "out.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
