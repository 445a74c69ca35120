"""Training losses and the metrics logged beside them.

Medusa (Cai et al., 2024): head k (0-based) reads h_t and predicts x_{t+2+k}; loss
    L = sum_k decay^k * CE(head_k(h_t), y_{t+2+k})            (paper: decay = 0.8)
averaged over the positions whose label is trained on. A label is valid when loss_mask marks it and
it lies in the same document as t (position_ids advance by exactly 2+k; this also rules out labels
past a packed document's end).

Labels are either the data's own next tokens ("data"), or the target's distribution at the position
that predicts the same token ("target": soft cross-entropy against softmax(target logits at t+1+k),
a teacher-forced self-distillation that aims the heads at what the target will verify).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specheads.data.packing import label_positions

LABEL_SOURCES = ("data", "target")


def simulated_accept_length(top1: list[float]) -> float:
    """tau_sim = 1 + sum_k prod_{j<=k} acc_j: the expected accepted length of a chain of heads.

    The 1 is the token the target always contributes (the bonus token). Treats the heads' marginal
    top-1 accuracies as if they were the conditional ones, so it is a guide, not a measurement.
    """
    tau, run = 1.0, 1.0
    for acc in top1:
        run *= acc
        tau += run
    return tau


def teacher_cross_entropy(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0):
    """(N, V) logits, (N, V) the target's logits -> (N,) cross-entropy against softmax(teacher / temperature):
    at 1 the target's distribution (soft labels); at 0 its top token alone (a hard cross-entropy)."""
    if temperature == 0:
        return F.cross_entropy(logits, teacher_logits.argmax(-1), reduction="none")
    return -(soft_labels(teacher_logits, temperature) * logits.log_softmax(-1)).sum(-1)


def soft_labels(teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(N, V) -> (N, V) softmax(teacher / temperature), or at 0 the one-hot of its argmax: the labels of
    `teacher_cross_entropy`."""
    if temperature == 0:
        return F.one_hot(teacher_logits.argmax(-1), teacher_logits.shape[-1]).float()
    return (teacher_logits.float() / temperature).softmax(-1)


def soft_topk_cross_entropy(
    logits: torch.Tensor, soft: torch.Tensor, top: torch.Tensor, p_top: torch.Tensor, weight: float
) -> torch.Tensor:
    """(N, V) logits, (N, V) soft labels (rows summing to 1), the target's K most likely ids (N, K) and
    their probabilities p (N, K) -> (N,) -sum soft log q - weight sum_K p log q, q = softmax(logits):
    the soft cross-entropy with HASS's top-K distillation term (train/eagle_losses.py) added.

    Its backward is written out, softmax(logits) (1 + weight sum_K p) - soft - weight p at the top ids, so
    the term costs a gather and a scatter of K columns, not a second log-softmax over the V and its backward
    (on 5,000 x 8,192 rows, one CPU thread: 0.64 s with the loss, against 1.6 s under autograd and 0.57 s
    for the loss alone)."""
    return _SoftTopKCrossEntropy.apply(logits, soft, top, p_top, weight)


class _SoftTopKCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, soft, top, p_top, weight):
        log_q = logits.log_softmax(-1)
        dot = torch.bmm(soft.unsqueeze(1), log_q.unsqueeze(2)).view(-1)  # sum soft log q, no (N, V) product
        loss = -dot - weight * (p_top * log_q.gather(-1, top)).sum(-1)
        ctx.save_for_backward(log_q, soft, top, p_top)
        ctx.weight = weight
        return loss

    @staticmethod
    def backward(ctx, grad):
        log_q, soft, top, p_top = ctx.saved_tensors
        w = ctx.weight * p_top
        g = log_q.exp().mul_(1 + w.sum(-1, keepdim=True)).sub_(soft)
        g.scatter_add_(-1, top, -w)
        return g.mul_(grad.unsqueeze(-1)), None, None, None, None


def sums_tensor(rows: list[list]) -> torch.Tensor:
    """(R, K) float64 sums from rows of floats or 0-dim tensors, on the tensors' device.

    The losses leave their sums where they were computed: reading one on the host would make a GPU wait
    for all the work queued before it, so the loop adds them up there and reads them when it logs.
    """
    device = next((v.device for row in rows for v in row if isinstance(v, torch.Tensor)), torch.device("cpu"))

    def one(v) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v.detach().to(torch.float64)
        return torch.full((), float(v), dtype=torch.float64, device=device)  # a fill: no copy from the host

    if not rows[0]:
        return torch.zeros(len(rows), 0, dtype=torch.float64, device=device)
    return torch.stack([torch.stack([one(v) for v in row]) for row in rows])


@dataclass
class HeadMetrics:
    """Sums over labelled positions, so batches and processes add up before dividing."""

    loss: list[float] = field(default_factory=list)  # per head, summed CE
    top1: list[float] = field(default_factory=list)
    topk: list[float] = field(default_factory=list)
    count: list[float] = field(default_factory=list)

    def as_tensor(self) -> torch.Tensor:
        return sums_tensor([self.loss, self.top1, self.topk, self.count])

    @staticmethod
    def summarise(sums: torch.Tensor, decay: float, topk: int) -> dict[str, float]:
        """(4, K) summed metrics -> per-head means, tau_sim and the weighted loss."""
        loss, top1, topk_hits, count = sums.clamp_min(0).double()
        n = count.clamp_min(1)
        acc1 = (top1 / n).tolist()
        out = {f"head{k}/top1": a for k, a in enumerate(acc1)}
        out |= {f"head{k}/top{topk}": a for k, a in enumerate((topk_hits / n).tolist())}
        out |= {f"head{k}/loss": v for k, v in enumerate((loss / n).tolist())}
        weights = torch.tensor([decay**k for k in range(len(acc1))], dtype=torch.float64)
        out["loss"] = float((weights * loss / n).sum())
        out["tau_sim"] = simulated_accept_length(acc1)
        out["tokens"] = float(count[0])
        return out


def medusa_loss(
    heads,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    decay: float = 0.8,
    topk: int = 5,
    target_logits: torch.Tensor | None = None,
    target_top1: bool = False,
    lm_head=None,
) -> tuple[torch.Tensor, HeadMetrics]:
    """Weighted Medusa loss over the labelled positions of a batch.

    Args:
        heads: MedusaHeads (or anything with `.num_heads` and `.head(k, hidden, lm_head)`).
        hidden: (B, T, H) the target's last hidden state after the final norm.
        input_ids, loss_mask, position_ids: (B, T); loss_mask[b, t] = 1 if x_t is a label.
        target_logits: (B, T, V) the target's logits; given, labels are the target's distributions.
        target_top1: with target_logits, the label is the target's top token alone (hard cross-entropy):
            what greedy verification accepts, and the data's own token wherever the data is the target's
            greedy output.
        lm_head: the target's lm_head, for heads that share it.

    Returns:
        (loss, metrics): loss = sum_k decay^k * mean CE_k; metrics hold per-head sums.
    """
    T = input_ids.shape[1]
    total = hidden.new_zeros(())
    metrics = HeadMetrics()
    offsets = [2 + k for k in range(heads.num_heads) if 2 + k < T]
    positions = label_positions(loss_mask, position_ids, offsets) if offsets else []
    for k in range(heads.num_heads):
        offset = 2 + k
        if offset >= T:
            (
                metrics.loss.append(0.0),
                metrics.top1.append(0.0),
                metrics.topk.append(0.0),
                metrics.count.append(0.0),
            )
            continue
        b, t = positions[k]  # label at t + offset
        logits = heads.head(k, hidden[b, t], lm_head).float()  # (N, V)
        labels = input_ids[b, t + offset]  # (N,)
        if target_logits is not None and target_top1:
            labels = target_logits[b, t + offset - 1].argmax(-1)  # the target's greedy x_{t+2+k}
        if target_logits is None or target_top1:
            ce = F.cross_entropy(logits, labels, reduction="none")
        else:
            # The target's logits at t+1+k predict x_{t+2+k}, the token head k predicts from t.
            teacher = target_logits[b, t + offset - 1]
            ce = teacher_cross_entropy(logits, teacher)
            labels = teacher.argmax(-1)
        n = max(len(labels), 1)
        total = total + decay**k * ce.sum() / n
        with torch.no_grad():
            top = logits.topk(min(topk, logits.shape[-1]), dim=-1).indices
            metrics.loss.append(ce.sum())
            metrics.top1.append((top[:, 0] == labels).sum())
            metrics.topk.append((top == labels[:, None]).any(-1).sum())
            metrics.count.append(float(len(labels)))
    return total, metrics
