"""A lean forward of an EAGLE head's decoder layer, for drafting on the CPU.

EAGLE drafts level by level: one head forward per tree level, over a few nodes each (dynamic-32: the
accepted path, then 8 nodes at each of 4 levels). On a CPU such a forward is dominated by the number of
kernels it launches, not by its arithmetic, and the stock layer launches many: separate q/k/v and
gate/up projections, the rotary angles recomputed from the positions, rotate_half built by slicing, the
attention back-end dispatch. `DraftLayer` runs the same computation with fewer of them:

    qkv  = a @ [W_q; W_k; W_v]^T (+ bias)        one matmul for the three projections, (B, m, (H_q + 2 H_kv) D)
    q, k = rope(q, k) with cos/sin rows read from a table of the head's own rotary embedding
    k, v = cache.update(k, v)                    the head's DynamicCache, as the stock layer appends to it
    h    = residual + o(sdpa(q, k, v, mask))
    out  = h + down(act(gate(n)) * up(n)),  n = rms_norm(h) (one kernel); [gate; up] one matmul

Weights are the head's own, concatenated and transposed once (a (in, out) right operand is the faster
CPU layout for the few rows a level feeds). The output equals the stock layer's up to float rounding
(tests/decode/test_draft_layer.py); the tree it drafts is verified exactly by the target in any case.
Only layer classes whose forward is this computation are taken (`DraftLayer.of`); any other layer, an
eager-attention head, or a head off the CPU keeps the stock forward.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# Attention and MLP classes whose stock forward is the computation above (no q/k norms, no soft-capping).
LEAN_ATTENTION = ("LlamaAttention", "MistralAttention", "Qwen2Attention")
LEAN_MLP = ("LlamaMLP", "MistralMLP", "Qwen2MLP")
LEAN_NORM = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")  # x · rsqrt(mean(x²) + eps) · weight
# Rope types whose angles depend on the position alone (a table indexed by position reproduces them).
STATIC_ROPE = ("default", "linear", "llama3")


class DraftLayer:
    """The lean forward of one head decoder layer (module docstring)."""

    @torch.no_grad()  # plain copies of the weights (no autograd history: a drafter can be deep-copied)
    def __init__(self, layer: nn.Module, rotary_emb: nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.qkv = torch.cat([p.weight for p in projections]).t().contiguous()  # (in, (H_q + 2 H_kv) D)
        biases = [p.bias for p in projections]
        self.qkv_bias = None if biases[0] is None else torch.cat(biases)
        self.o = attn.o_proj.weight.t().contiguous()
        self.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous()
        self.down = mlp.down_proj.weight.t().contiguous()
        self.act = mlp.act_fn
        norm = layer.post_attention_layernorm  # an RMSNorm of these classes: F.rms_norm, one kernel
        self.norm_weight, self.norm_eps = norm.weight.detach(), norm.variance_epsilon
        self.head_dim = attn.head_dim
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.scaling = attn.scaling
        self.gqa = self.q_size != self.kv_size
        self.layer_idx = attn.layer_idx
        self.rotary_emb = rotary_emb
        self._table = None  # (positions, 2, D) cos and sin

    @classmethod
    def of(cls, layer: nn.Module, rotary_emb: nn.Module) -> DraftLayer | None:
        """The lean forward of `layer`, or None where the stock one must run (module docstring)."""
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if type(attn).__name__ not in LEAN_ATTENTION or type(mlp).__name__ not in LEAN_MLP:
            return None
        if type(getattr(layer, "post_attention_layernorm", None)).__name__ not in LEAN_NORM:
            return None
        if getattr(attn.config, "_attn_implementation", None) != "sdpa":
            return None
        if attn.o_proj.bias is not None or any(
            getattr(p, "bias", None) is not None for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        ):
            return None
        if (
            getattr(rotary_emb, "rope_type", "default") not in STATIC_ROPE
            or attn.q_proj.weight.device.type != "cpu"
        ):
            return None
        return cls(layer, rotary_emb)

    def rope_rows(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 1, m, D) cos and sin at `positions` (B, m), read from a table grown on demand."""
        needed = int(positions.max()) + 1
        if self._table is None or self._table.shape[0] < needed or self._table.dtype != like.dtype:
            size = max(needed, 2 * (0 if self._table is None else self._table.shape[0]), 256)
            cos, sin = self.rotary_emb(like, torch.arange(size, device=like.device)[None])
            self._table = torch.stack([cos[0], sin[0]], dim=1)  # (size, 2, D)
        cos, sin = self._table[positions][:, None].unbind(-2)  # (B, 1, m, D) each
        return cos, sin

    def __call__(
        self,
        residual: torch.Tensor,
        attn_input: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache,
    ) -> torch.Tensor:
        """(B, m, H) residual stream and (B, m, H_in) attention input -> (B, m, H) the layer's output.

        Args:
            position_ids: (B, m).
            attention_mask: (B, 1, m, past + m) additive.
            cache: the head's DynamicCache (appended to, as by the stock layer).
        """
        b, m = attn_input.shape[:2]
        qkv = attn_input @ self.qkv
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        # (B, H_q + 2 H_kv, m, D): the query heads, then the key heads, then the value heads
        heads = qkv.view(b, m, -1, self.head_dim).transpose(1, 2)
        rotary, v = heads.split(
            [(self.q_size + self.kv_size) // self.head_dim, self.kv_size // self.head_dim], 1
        )
        cos, sin = self.rope_rows(position_ids, residual)
        q, k = _rotate(rotary, cos, sin).split(
            [self.q_size // self.head_dim, self.kv_size // self.head_dim], 1
        )
        k, v = cache.update(k, v, self.layer_idx)
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, scale=self.scaling, enable_gqa=self.gqa
        )  # (B, H_q, m, D)
        h = residual + attended.transpose(1, 2).reshape(b, m, -1) @ self.o
        normed = F.rms_norm(h, (h.shape[-1],), self.norm_weight, self.norm_eps)
        gate, up = (normed @ self.gate_up).chunk(2, dim=-1)
        return h + (self.act(gate) * up) @ self.down


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x · cos + rotate_half(x) · sin, rotate_half(x) = cat(-x2, x1) (HF's apply_rotary_pos_emb)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
