"""EAGLE losses: EAGLE-1/2 feature + token loss, and EAGLE-3's training-time test.

Shifts, for one document with tokens x_0 .. x_{T-1} and the target's features at the same positions
(loss_mask[t] = 1 when x_t is a label, as the data pipeline writes it):

EAGLE-1/2, position t reads f_t and embed(x_{t+1}) and predicts f_{t+1}:
    feature label  f_{t+1}                                   hidden[:, t + 1]
    token label    softmax(target logits at t+1), the target's distribution of x_{t+2}
    trained when   x_{t+2} is a label of the same document   shift_loss_mask(loss_mask, position_ids, 2)
    L = w_feat · mean SmoothL1(f̂_{t+1}, f_{t+1}) + w_tok · mean soft-CE       (paper: 1.0, 0.1)
The input feature gets uniform noise U(-noise, noise) in training (paper 0.1; not scaled by the
sequence length as one reference script did), never in eval mode. Positions where the next token or the
next feature is missing (a document's last position, where the reference read a zero-padded label)
are never trained: x_{t+2} must exist, so x_{t+1} and f_{t+1} do too.

EAGLE-3, step i = 0 .. N-1 (training-time test), position t:
    reads          step 0: g_t = fc(cat(low_t, mid_t, high_t)); step i >= 1: h^{i-1}_t, the head's own
                   output at t from the step before (standing for the feature at t+i)
                   and embed(x_{t+1+i}), at rope position position_ids[t] + i
    attends to     step-0 entries at positions s <= t of its document (real features), and its own
                   entries of steps 1..i (the diagonal): exactly what a tree node at depth i+1 sees
                   when drafting (the real past, then its ancestors)
    token label    softmax over the draft vocabulary of the target's logits at t+1+i (predicts x_{t+2+i}),
                   divided by `temperature` (1 by default; 0: the target's top token as a hard label)
    trained when   x_{t+2+i} is a label of the same document and (out_of_vocab "skip", the default) the
                   target's argmax at t+1+i is in the draft vocabulary; the positions where it is not are
                   counted (`step{i}/out_of_vocab`) and scored as misses in the accuracies, not silently
                   dropped. "train" (Model Optimizer's) trains them too, against the target's distribution
                   renormalised over the draft vocabulary (no draft token can match their greedy label)
    L = sum_i decay^i · mean soft-CE_i                                          (paper: decay 0.8)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow.compute as pc
import torch
import torch.nn.functional as F

from specheads.data.packing import document_attention_mask, label_positions
from specheads.train.losses import (
    simulated_accept_length,
    soft_labels,
    soft_topk_cross_entropy,
    sums_tensor,
    teacher_cross_entropy,
)

OUT_OF_VOCAB = ("skip", "train")  # EAGLE-3: positions whose target token the draft vocabulary lacks


def next_tokens(input_ids: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) -> (B, T): x_{t+k} at t. The last k columns repeat x_{T-1}, a stand-in never trained on."""
    tail = input_ids[:, -1:].expand(-1, min(k, input_ids.shape[1]))
    return torch.cat([input_ids[:, k:], tail], dim=1)


def next_tokens_embeds(input_embeds: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T, H) -> (B, T, H): embed(x_{t+k}) at t, with the same stand-in tail as `next_tokens`."""
    tail = input_embeds[:, -1:].expand(-1, min(k, input_embeds.shape[1]), -1)
    return torch.cat([input_embeds[:, k:], tail], dim=1)


def draft_attention_mask(
    attention_mask: torch.Tensor | None, position_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The batch's mask as the head takes it: additive (B, 1, T, T), causal within each document.

    Args:
        attention_mask: None, a (B, T) 0/1 padding mask (unpacked batches) or a packed batch's
            additive (B, 1, T, T) document mask.
        position_ids: (B, T), restarting at 0 per document.
    """
    if attention_mask is not None and attention_mask.ndim == 4:
        return attention_mask.to(dtype)
    padding = (
        torch.zeros_like(position_ids, dtype=torch.bool) if attention_mask is None else attention_mask == 0
    )
    return document_attention_mask(position_ids, padding, dtype)


def ttt_step_mask(first_step: torch.Tensor, step: int) -> torch.Tensor:
    """Training-time test mask of step `step`: (B, 1, T, T) -> (B, 1, T, (step + 1) · T) additive.

    Keys are the draft cache after this step: T step-0 entries, then T entries per later step. Query t
    attends to the step-0 keys `first_step` allows (the real past of its document) and to the keys of
    steps 1..step at index t only (its own fed-back entries); nothing else.
    """
    B, _, T, _ = first_step.shape
    eye = torch.eye(T, dtype=torch.bool, device=first_step.device)
    diagonal = torch.zeros(T, T, dtype=first_step.dtype, device=first_step.device)
    diagonal = diagonal.masked_fill(~eye, torch.finfo(first_step.dtype).min).expand(B, 1, T, T)
    return torch.cat([first_step, *([diagonal] * step)], dim=-1)


def eagle3_unroll(
    head,
    fused: torch.Tensor,
    input_embeds: torch.Tensor,
    position_ids: torch.Tensor,
    first_step_mask: torch.Tensor,
    steps: int,
) -> list[torch.Tensor]:
    """Run the EAGLE-3 head for `steps` training-time-test steps; returns h^i (B, T, H) per step.

    Args:
        fused: (B, T, H) g_t = fc(cat(low, mid, high)) at each position.
        input_embeds: (B, T, H) embed(x_t) (not shifted; step i reads x_{t+1+i}).
        first_step_mask: (B, 1, T, T) additive, causal within each document.
    """
    from transformers import DynamicCache  # lazy: transformers adds seconds to every command's start

    cache = DynamicCache()  # holds every step's keys/values: what later steps attend to
    hidden, outputs = fused, []
    for i in range(steps):
        embeds = next_tokens_embeds(input_embeds, 1 + i)
        hidden = head(hidden, embeds, position_ids + i, ttt_step_mask(first_step_mask, i), cache)
        outputs.append(hidden)
    return outputs


@dataclass
class DraftMetrics:
    """Per draft step (EAGLE-1/2: one; EAGLE-3: one per training-time-test step), summed over
    positions so that batches and processes add up before dividing."""

    loss: list[float] = field(default_factory=list)  # soft-CE, summed over trained positions
    feature: list[float] = field(default_factory=list)  # SmoothL1 (EAGLE-1/2), summed
    top1: list[float] = field(default_factory=list)  # draft argmax == target argmax
    topk: list[float] = field(default_factory=list)
    count: list[float] = field(default_factory=list)  # positions with a label
    out_of_vocab: list[float] = field(default_factory=list)  # ... whose target token the draft can't emit
    trained: list[float] = field(default_factory=list)  # ... in the loss

    ROWS = 7

    def add(
        self, loss=0.0, feature=0.0, top1=0.0, topk=0.0, count=0.0, out_of_vocab=0.0, trained=None
    ) -> None:
        """`trained` defaults to count - out_of_vocab: the positions outside the draft vocabulary untrained."""
        trained = count - out_of_vocab if trained is None else trained
        for name, value in zip(
            ("loss", "feature", "top1", "topk", "count", "out_of_vocab", "trained"),
            (loss, feature, top1, topk, count, out_of_vocab, trained),
        ):
            getattr(self, name).append(value)  # floats, or 0-dim tensors left on their device

    def as_tensor(self) -> torch.Tensor:
        return sums_tensor(
            [self.loss, self.feature, self.top1, self.topk, self.count, self.out_of_vocab, self.trained]
        )

    @staticmethod
    def summarise(
        sums: torch.Tensor, weights: list[float], topk: int, w_feat: float = 0.0
    ) -> dict[str, float]:
        """(7, K) summed metrics -> per-step means, tau_sim and the weighted loss.

        loss = w_feat · mean feature loss + sum_i weights[i] · mean soft-CE_i, as in training.
        """
        loss, feature, top1, topk_hits, count, oov, trained = sums.clamp_min(0).double()
        n, trained = count.clamp_min(1), trained.clamp_min(1)
        acc1 = (top1 / n).tolist()
        out = {}
        for i, a in enumerate(acc1):
            out[f"step{i}/top1"] = a
            out[f"step{i}/top{topk}"] = float(topk_hits[i] / n[i])
            out[f"step{i}/loss"] = float(loss[i] / trained[i])
            out[f"step{i}/out_of_vocab"] = float(oov[i] / n[i])
        w = torch.tensor(weights, dtype=torch.float64)
        out["loss"] = float((w * loss / trained).sum() + w_feat * feature[0] / n[0])
        if w_feat or feature.any():
            out["feature_loss"] = float(feature[0] / n[0])
        out["out_of_vocab"] = float(oov.sum() / n.sum())
        out["tau_sim"] = simulated_accept_length(acc1)
        out["tokens"] = float(count[0])
        return out


def _hits(draft_top: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, k) draft guesses (target ids), (N,) target tokens -> (top-1 hits, top-k hits), on the device."""
    return (draft_top[:, 0] == labels).sum(), (draft_top == labels[:, None]).any(-1).sum()


def eagle_loss(
    head,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor,
    target_logits: torch.Tensor,
    embed_tokens,
    lm_head,
    *,
    attention_mask: torch.Tensor | None = None,
    w_feat: float = 1.0,
    w_tok: float = 0.1,
    noise: float = 0.1,
    topk: int = 5,
) -> tuple[torch.Tensor, DraftMetrics]:
    """EAGLE-1/2 loss over a batch (shifts in the module docstring).

    Args:
        head: EagleHead.
        hidden: (B, T, H) the target's last hidden state after the final norm, f_t.
        input_ids, loss_mask, position_ids: (B, T) from `collate`.
        target_logits: (B, T, V) the target's logits (lm_head(f_t)).
        embed_tokens, lm_head: the target's, shared by the head.
        attention_mask: the batch's (padding or packed document mask).
        noise: half-width a of the U(-a, a) noise on input features while head.training.

    Returns:
        (loss, metrics).
    """
    dtype = head.fc.weight.dtype
    features = hidden.to(dtype)
    if head.training and noise > 0:
        features = features + (torch.rand_like(features) * 2 - 1) * noise
    predicted = head(
        features,
        head.embed(embed_tokens, next_tokens(input_ids, 1)).to(dtype),  # embed(x_{t+1}) at t
        position_ids,
        draft_attention_mask(attention_mask, position_ids, dtype),
    )  # (B, T, H): f̂_{t+1} at t
    ((b, t),) = label_positions(loss_mask, position_ids, [2])
    pred = predicted[b, t]  # (N, H)
    feature = F.smooth_l1_loss(pred.float(), hidden[b, t + 1].float(), reduction="none").mean(-1)  # (N,)
    logits = head.logits(pred, lm_head).float()  # (N, V)
    teacher = target_logits[b, t + 1]  # the target's logits of x_{t+2}
    ce = teacher_cross_entropy(logits, teacher)  # (N,)
    n = max(len(b), 1)
    loss = w_feat * feature.sum() / n + w_tok * ce.sum() / n
    metrics = DraftMetrics()
    with torch.no_grad():
        top = logits.topk(min(topk, logits.shape[-1]), dim=-1).indices
        top1, topk_hits = _hits(top, teacher.argmax(-1))
        metrics.add(ce.sum(), feature.sum(), top1, topk_hits, len(b))
    return loss, metrics


def eagle3_loss(
    head,
    features: dict[int, torch.Tensor],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor,
    target_logits: torch.Tensor,
    embed_tokens,
    *,
    target_tokens: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    steps: int = 7,
    decay: float = 0.8,
    topk: int = 5,
    noise: float = 0.0,
    temperature: float = 1.0,
    out_of_vocab: str = "skip",
    topk_loss: int = 0,
    topk_loss_weight: float = 1.0,
) -> tuple[torch.Tensor, DraftMetrics]:
    """EAGLE-3 training-time-test loss over a batch (shifts and masks in the module docstring).

    Args:
        head: Eagle3Head.
        features: the target's captured layers, id -> (B, T, H_target); must hold head.capture_layers.
        input_ids, loss_mask, position_ids: (B, T) from `collate`.
        target_logits: (B, T, V) the target's logits; (B, T, Vd), the draft vocabulary's columns
            (head.vocab_target_ids()) alone, where `target_tokens` gives the whole vocabulary's argmax.
        embed_tokens: the target's embedding, shared by the head.
        target_tokens: (B, T) the argmax of the target's logits over the whole vocabulary, with the columns
            (held-out states kept: train/held_out.py); None: taken from `target_logits`.
        steps: unrolled steps N (paper 5-7); decay: weight of step i is decay**i.
        noise: half-width a of the U(-a, a) noise on each captured layer while head.training (EAGLE-1's
            augmentation, applied to the step-0 input features; the paper's EAGLE-3 has none: 0).
        temperature: the labels are softmax(target logits / temperature) over the draft vocabulary: 1 is the
            target's distribution (the paper's, SpecForge's, Model Optimizer's); 0 its top token alone (a
            hard cross-entropy: what greedy verification accepts).
        out_of_vocab: "skip" (positions whose target token lies outside the draft vocabulary weigh 0) or
            "train" (they are trained too, as Model Optimizer does).
        topk_loss, topk_loss_weight: K and w of HASS's top-K distillation, added at every step and position
            (`topk_teacher`, `soft_topk_cross_entropy`); K 0: none.

    Returns:
        (loss, metrics): metrics hold one column per step.
    """
    if out_of_vocab not in OUT_OF_VOCAB:
        raise ValueError(f"out_of_vocab must be one of {OUT_OF_VOCAB}, got {out_of_vocab!r}")
    skip = out_of_vocab == "skip"
    dtype = head.fc.weight.dtype
    captured = {i: features[i].to(dtype) for i in head.capture_layers}
    if head.training and noise > 0:
        captured = {i: f + (torch.rand_like(f) * 2 - 1) * noise for i, f in captured.items()}
    fused = head.input_hidden(captured)  # (B, T, H)
    outputs = eagle3_unroll(
        head,
        fused,
        head.embed(embed_tokens, input_ids).to(dtype),
        position_ids,
        draft_attention_mask(attention_mask, position_ids, dtype),
        steps,
    )
    if target_tokens is None:
        target_tokens = target_logits.argmax(-1)  # (B, T) the target's greedy token after t
        # the teacher's draft-vocabulary columns, taken once: gathering (N, V) rows of the full logits at
        # every step, then their columns, cost about a fifth of a SmolLM2 step (V 49,152, Vd 8,192)
        # (by index, not the t2d mask: a mask's columns are found with a nonzero, a GPU synchronisation;
        # indexing, not index_select(-1, ...): the same gather, which torch runs several times quicker on
        # the last dimension on a CPU: benchmarks/bench_teacher_columns.py): (B, T, Vd)
        teacher_logits = target_logits[..., head.vocab_target_ids().to(target_logits.device)]
    elif target_logits.shape[-1] == head.config.draft_vocab_size:
        teacher_logits = target_logits  # the columns alone
    else:
        raise ValueError(
            f"with target_tokens, target_logits must hold the draft vocabulary's {head.config.draft_vocab_size} "
            f"columns, got {target_logits.shape[-1]}"
        )
    in_vocab = head.t2d[target_tokens]  # (B, T)
    hass = topk_teacher(teacher_logits, topk_loss) if topk_loss else None  # once for every step's positions
    total = fused.new_zeros((), dtype=torch.float32)
    metrics = DraftMetrics()
    positions = label_positions(loss_mask, position_ids, [2 + i for i in range(len(outputs))])
    for i, (h, (b, t)) in enumerate(zip(outputs, positions)):
        label_at = t + 1 + i  # the target's logits there predict x_{t+2+i}
        emittable = in_vocab[b, label_at]  # (N,) the target's top token is in the draft vocabulary
        logits = head.logits(h[b, t]).float()  # (N, Vd)
        # skipped positions (those whose target token the draft cannot emit) are weighed 0 rather than
        # dropped: their count stays on the device (where kept, the draft-vocabulary argmax is the target's)
        keep = emittable if skip else torch.ones_like(emittable)
        if topk_loss:
            soft = soft_labels(teacher_logits[b, label_at], temperature)
            top, p = hass[0][b, label_at], hass[1][b, label_at]
            ce = soft_topk_cross_entropy(logits, soft, top, p, topk_loss_weight) * keep
        else:
            ce = teacher_cross_entropy(logits, teacher_logits[b, label_at], temperature) * keep
        trained = keep.sum()
        total = total + decay**i * ce.sum() / trained.clamp_min(1)
        with torch.no_grad():
            top = head.to_target_ids(logits.topk(min(topk, logits.shape[-1]), dim=-1).indices)
            top1, topk_hits = _hits(top, target_tokens[b, label_at])
            metrics.add(ce.sum(), 0.0, top1, topk_hits, len(b), len(b) - emittable.sum(), trained)
    return total, metrics


def topk_teacher(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., V) the target's logits -> its k most likely ids (..., k) and their probabilities at temperature 1
    (..., k): HASS's top-K distillation term is -sum over them of p log q (`soft_topk_cross_entropy`). p is
    not renormalised over the k: where the target is sure the term weighs its top token up to `weight` times
    more, where it is spread, little."""
    with torch.no_grad():
        z, top = teacher_logits.topk(min(k, teacher_logits.shape[-1]), dim=-1)
        return top, (z.float() - teacher_logits.float().logsumexp(-1, keepdim=True)).exp()


def count_label_tokens(rows, vocab_size: int) -> torch.Tensor:
    """(V,) int64: how often each token is a label (loss_mask 1) in tokenised rows (tokenize_rows).

    `rows` is a `datasets.Dataset` (read in Arrow batches, without a Python loop over tokens) or a
    list of dicts.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in _flat_label_batches(rows):
        counts += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
    return counts


def _flat_label_batches(rows, batch_size: int = 4096):
    """Yield (ids, loss_mask) as flat int64 tensors, a batch of rows at a time."""
    if hasattr(rows, "with_format"):  # a datasets.Dataset: flatten the Arrow list columns
        columns = rows.select_columns(["input_ids", "loss_mask"]).with_format("arrow")
        for batch in columns.iter(batch_size=batch_size):
            yield tuple(
                torch.from_numpy(pc.list_flatten(batch[c]).to_numpy(zero_copy_only=False).astype("int64"))
                for c in ("input_ids", "loss_mask")
            )
        return
    for row in rows:
        yield (
            torch.as_tensor(row["input_ids"], dtype=torch.long),
            torch.as_tensor(row["loss_mask"], dtype=torch.long),
        )
