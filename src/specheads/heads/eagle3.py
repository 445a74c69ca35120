"""EAGLE-3 draft head (Li et al., 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test").

EAGLE-3 drops feature regression: it fuses three of the target's layers and predicts tokens only.

    g_t      = fc(cat(low_t, mid_t, high_t))             # (B, T, 3·H_target) -> (B, T, H)
    h_t      = layer(emb = embed(x_{t+1}), hidden = g_t)  # attention reads cat(input_norm(emb), hidden_norm(g))
    logits_t = lm_head(norm(h_t))                         # over the draft vocabulary; predicts x_{t+2}

Layer ids are FrozenTarget's, i.e. Hugging Face `hidden_states` indexing (0 = embeddings, i = output
of decoder layer i-1, L = after the final norm). The default (2, L//2, L-3) is the reference's choice
(targets of 4-6 layers take (1, L//2, L-1): see default_eagle3_layers); SGLang and ModelOpt number the
same layers (1, L//2-1, L-4), counting decoder-layer outputs from 0. Ids are distinct and ascending.

Training-time test (train/eagle_losses.py) unrolls the head: step i >= 1 feeds back h from step i-1
in place of g, so the head learns from its own features as it will meet them when drafting deeper
tree levels.

Draft vocabulary: the head predicts over `draft_vocab_size` tokens, the most frequent in the training
data. Draft id i is target id i + d2t[i] (d2t int64 offsets); t2d is a bool mask over the target
vocabulary, True for the tokens the draft can propose. Both are buffers, stored in the checkpoint.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from specheads.core.hf_compat import cache_kwargs
from specheads.heads.eagle import DraftLayerConfig, clone_norm, draft_embedding

_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def default_eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """(low, mid, high) in HF hidden_states indexing: distinct, ascending, each one an engine can capture.

    The reference's (2, L//2, L-3) (vLLM `get_eagle3_aux_hidden_state_layers`, SGLang
    `set_eagle3_layers_to_capture`, SpecForge's (1, L//2-1, L-4) counted from 0) is ascending only from
    L = 7: for L = 4, 5, 6 it repeats a layer ((2, 2, 1), (2, 2, 2), (2, 3, 3)), and the engines, which
    capture each layer once, would feed 2H or H features into a 3H fc. Shallower targets take
    (1, L//2, L-1) instead: the streams entering the second, middle and last decoder layers.
    """
    if num_layers < 4:
        raise ValueError(
            f"EAGLE-3 fuses 3 distinct layers an engine can capture (HF ids 1..L-1); a {num_layers}-layer "
            "target has fewer"
        )
    reference = (2, num_layers // 2, num_layers - 3)
    if reference[0] < reference[1] < reference[2]:
        return reference
    return (1, num_layers // 2, num_layers - 1)


def check_ascending_layers(layers: tuple[int, ...] | list[int], what: str) -> None:
    """Refuse captured layer ids that repeat or are out of order (engines capture each once, ascending)."""
    layers = [int(i) for i in layers]
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise ValueError(
            f"{what}: EAGLE-3 layer ids {layers} must be distinct and ascending (low, mid, high): SGLang and "
            f"vLLM capture each layer once, in ascending order, so fc would read them as {sorted(set(layers))}"
        )


def draft_vocab_from_counts(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent target ids, ascending (ties go to the smaller id).

    Tokens never seen fill the remaining places in id order, so the draft vocabulary always has `size`
    entries.

    Args:
        counts: (V,) how often each target token occurs as a label in the training data.
        size: draft vocabulary size, 1 <= size <= V.
    """
    vocab_size = counts.numel()
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab_size} (the target's vocabulary), got {size}")
    # Stable sort by descending count keeps equal counts in id order.
    order = torch.sort(counts.to(torch.float64), descending=True, stable=True).indices
    return order[:size].sort().values.to(torch.long)


def vocab_maps(draft_to_target: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending target ids of the draft vocabulary -> (d2t (Vd,) int64, t2d (V,) bool).

    target_id = i + d2t[i]; t2d[target_id] is True exactly for the draft vocabulary.
    """
    ids = draft_to_target.to(torch.long)
    if ids.ndim != 1 or (ids[1:] <= ids[:-1]).any() or ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"draft vocabulary must be strictly ascending target ids in 0..{vocab_size - 1}")
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


@torch.no_grad()
def rms_norm_state_like(draft_norm: nn.Module, norm: nn.Module) -> dict[str, torch.Tensor]:
    """The state of `draft_norm` (an RMSNorm x · rsqrt(mean(x²) + eps) · w, a Llama draft layer's) with
    which it computes what the target's final `norm` of another class does, e.g. Gemma's x · ... · (1 + w)
    or Qwen3's own RMSNorm class: w is read off `norm`'s output on a constant input, whose RMS is so large
    that eps does not count, then checked on random inputs. A norm that is no RMSNorm is refused."""
    weight = draft_norm.weight
    ref = next(iter(norm.parameters()), weight)
    size = weight.numel()
    big = torch.full((1, size), 1e3, dtype=torch.float32, device=ref.device)
    scale = norm(big.to(ref.dtype))[0].to(weight.dtype)  # x / rms(x) is 1 here: the output is w
    x = torch.randn(8, size, generator=torch.Generator().manual_seed(0)).to(ref.device)
    theirs = norm(x.to(ref.dtype)).float()
    candidate = copy.deepcopy(draft_norm).float()
    candidate.weight.copy_(scale.to(ref.device))
    ours = candidate.to(ref.device)(x)
    tolerance = 16 * torch.finfo(ref.dtype).eps * float(theirs.abs().max())
    if theirs.shape != ours.shape or float((theirs - ours).abs().max()) > tolerance:
        raise ValueError(
            f"the target's final norm {type(norm).__name__} is not an RMSNorm the draft's "
            f"{type(draft_norm).__name__} can reproduce; train with draft_head_init: random"
        )
    return {"weight": scale}


@dataclass(frozen=True)
class Eagle3Config(DraftLayerConfig):
    """EAGLE-3 head: the target's config, the captured layers and the draft vocabulary size."""

    draft_vocab_size: int = 32000
    # (low, mid, high) in HF hidden_states indexing, ascending; empty: default_eagle3_layers(L)
    target_layers: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        num_layers = self.target_num_layers
        layers = tuple(int(i) for i in self.target_layers) or default_eagle3_layers(num_layers)
        if len(layers) != 3 or not all(0 <= i <= num_layers for i in layers):
            raise ValueError(
                f"EAGLE-3 fuses 3 target layers with ids in 0..{num_layers} (HF hidden_states indexing), "
                f"got {list(layers)}"
            )
        check_ascending_layers(layers, "Eagle3Config")
        object.__setattr__(self, "target_layers", layers)
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in 1..{self.vocab_size} (the target's vocabulary), "
                f"got {self.draft_vocab_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layers"] = list(self.target_layers)
        return d


class Eagle3Head(nn.Module):
    """Fusion fc, one decoder layer over cat(input_norm(emb), hidden_norm(h)), own norm and lm_head.

    forward(hidden (B, T, H), input_embeds (B, T, H), position_ids (B, T), attention_mask
    (B, 1, T, past + T) additive, cache) -> h (B, T, H), the layer's output before the final norm (what
    training-time test and tree drafting feed back). `input_embeds[:, t]` is the embedding of the token
    after the one `hidden[:, t]` stands for.
    """

    method = "eagle3"
    config_class = Eagle3Config

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        h, vd = config.hidden_size, config.draft_vocab_size
        self.fc = nn.Linear(len(config.target_layers) * h, h, bias=False)
        # The stock layer class, with q/k/v widened to read 2H. Its own forward cannot be used: it adds
        # its attention input back as the residual, and here that input (2H) is not the residual (h).
        # `forward` below wires the stock submodules instead; the weight names match SGLang's `midlayer`.
        layer, self.rotary_emb = config.stock_layer()
        for name in _PROJECTIONS:
            old = getattr(layer.self_attn, name, None)
            if not isinstance(old, nn.Linear):
                raise TypeError(
                    f"EAGLE-3 needs separate q/k/v projections; {type(layer.self_attn).__name__} has no "
                    f"nn.Linear {name!r}: train with draft_arch: llama (a Llama draft layer, whatever the "
                    "target's family)"
                )
            setattr(layer.self_attn, name, nn.Linear(2 * h, old.out_features, bias=old.bias is not None))
        layer.hidden_norm = clone_norm(layer.input_layernorm)
        self.midlayer = layer
        self.norm = clone_norm(layer.input_layernorm)
        self.lm_head = nn.Linear(h, vd, bias=False)
        # Until set_draft_vocab: the first Vd target ids.
        d2t, t2d = vocab_maps(torch.arange(vd), config.vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)

    def embed(self, embed_tokens: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The head's input embeddings of `ids` from the target's `embed_tokens` (draft_embedding)."""
        return draft_embedding(self.config, embed_tokens, ids)

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """The target layers fused by fc, (low, mid, high), FrozenTarget / HF hidden_states indexing."""
        return self.config.target_layers

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    @torch.no_grad()
    def set_draft_vocab(self, draft_to_target: torch.Tensor) -> Eagle3Head:
        """Set d2t / t2d from the ascending target ids of the draft vocabulary (draft_vocab_from_counts)."""
        if draft_to_target.numel() != self.config.draft_vocab_size:
            raise ValueError(
                f"draft vocabulary has {draft_to_target.numel()} ids, the head predicts "
                f"{self.config.draft_vocab_size}"
            )
        d2t, t2d = vocab_maps(draft_to_target.cpu(), self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        return self

    @torch.no_grad()
    def init_from_target(self, lm_head: nn.Module, norm: nn.Module) -> Eagle3Head:
        """Start the draft's lm_head from the target's rows of the draft vocabulary (d2t: set it first) and
        its final norm from the target's: the draft then begins by reading its layer's output as the target
        reads its last hidden state, instead of through a random projection."""
        weight = lm_head.weight
        if weight.shape[1] != self.lm_head.in_features or getattr(lm_head, "bias", None) is not None:
            raise ValueError(
                f"the target's lm_head {tuple(weight.shape)} (bias: {getattr(lm_head, 'bias', None) is not None}) "
                f"cannot start a draft lm_head of hidden size {self.lm_head.in_features} without a bias"
            )
        norm_state = (
            norm.state_dict() if type(norm) is type(self.norm) else rms_norm_state_like(self.norm, norm)
        )
        # both checked before either is written: a refused target leaves the head as it was
        self.lm_head.weight.copy_(weight[self.vocab_target_ids().to(weight.device)])
        self.norm.load_state_dict(norm_state)
        return self

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids -> target ids: i + d2t[i]."""
        return draft_ids + self.d2t[draft_ids]

    def vocab_target_ids(self) -> torch.Tensor:
        """(Vd,) the target ids of the whole draft vocabulary, ascending (draft id order)."""
        return self.to_target_ids(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))

    def input_hidden(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        """Captured target layers (keyed by id) -> g = fc(cat(low, mid, high)) (B, T, H)."""
        return self.fc(torch.cat([features[i] for i in self.capture_layers], dim=-1))

    @property
    def layer(self) -> nn.Module:
        """The decoder layer (`forward` wires its submodules over `attention_inputs`)."""
        return self.midlayer

    def attention_inputs(
        self, hidden: torch.Tensor, input_embeds: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual h (B, T, H), attention input cat(input_norm(emb), hidden_norm(h)) (B, T, 2H))."""
        layer = self.midlayer
        return hidden, torch.cat([layer.input_layernorm(input_embeds), layer.hidden_norm(hidden)], dim=-1)

    def forward(
        self,
        hidden: torch.Tensor,
        input_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache=None,
    ) -> torch.Tensor:
        layer = self.midlayer
        hidden, x = self.attention_inputs(hidden, input_embeds)  # x (B, T, 2H)
        attended, _ = layer.self_attn(
            hidden_states=x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=self.rotary_emb(hidden, position_ids),  # (cos, sin)
            **cache_kwargs(layer.self_attn, cache),
        )
        h = hidden + attended
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """(..., H) layer output -> (..., Vd) logits over the draft vocabulary (own norm and lm_head)."""
        return self.lm_head(self.norm(h))
