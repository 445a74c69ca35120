"""Medusa loss: offsets, weights, masks, document boundaries, distillation labels, tau_sim."""

import pytest
import torch
import torch.nn.functional as F

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.train.losses import HeadMetrics, medusa_loss, simulated_accept_length

V, K = 10, 3


def oracle(input_ids: torch.Tensor, shift: int = 0) -> tuple[MedusaHeads, torch.Tensor]:
    """Heads and hidden states that hand head k the token at t + 2 + k + shift.

    hidden[b, t] is K one-hot blocks; block k holds x_{t+2+k+shift} and head k's projection reads
    block k alone, so with shift 0 a correctly-offset loss sees perfect heads.
    """
    B, T = input_ids.shape
    heads = MedusaHeads(MedusaConfig(hidden_size=K * V, vocab_size=V, num_heads=K))
    hidden = torch.zeros(B, T, K * V)
    with torch.no_grad():
        for k in range(K):
            heads.lm_heads[k].weight.zero_()
            heads.lm_heads[k].weight[:, k * V : (k + 1) * V] = 20 * torch.eye(V)
            off = 2 + k + shift
            hidden[:, : T - off, k * V : (k + 1) * V] = F.one_hot(input_ids[:, off:], V).float()
    return heads, hidden


def random_heads(seed: int) -> tuple[MedusaHeads, torch.Tensor]:
    """K heads with every weight drawn from N(0, 1), and hidden states (3, 16, 12) for them."""
    heads = MedusaHeads(MedusaConfig(hidden_size=12, vocab_size=V, num_heads=K))
    torch.manual_seed(seed)
    for p in heads.parameters():
        torch.nn.init.normal_(p)
    return heads, torch.randn(3, 16, 12)


def batch(B=3, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    return ids, torch.ones(B, T), torch.arange(T).expand(B, T)


def test_head_k_predicts_the_token_two_plus_k_ahead():
    ids, mask, pos = batch()
    heads, hidden = oracle(ids)
    loss, metrics = medusa_loss(heads, hidden, ids, mask, pos)
    summary = HeadMetrics.summarise(metrics.as_tensor(), 0.8, 5)
    assert [summary[f"head{k}/top1"] for k in range(K)] == [1.0, 1.0, 1.0]
    assert loss.item() < 1e-6
    # Each head is scored on the T - (2 + k) positions that have a label.
    assert metrics.count == [3 * (16 - 2 - k) for k in range(K)]


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_shifted_label_fails(shift):
    ids, mask, pos = batch(B=8, T=64)
    heads, hidden = oracle(ids, shift=shift)
    loss, metrics = medusa_loss(heads, hidden, ids, mask, pos)
    summary = HeadMetrics.summarise(metrics.as_tensor(), 0.8, 5)
    assert all(summary[f"head{k}/top1"] < 0.4 for k in range(K))
    assert loss.item() > 5


def test_loss_is_the_decay_weighted_sum_of_per_head_means():
    ids, mask, pos = batch()
    heads, hidden = random_heads(seed=0)
    loss, _ = medusa_loss(heads, hidden, ids, mask, pos, decay=0.5)
    logits = heads(hidden)
    expected = sum(
        0.5**k * F.cross_entropy(logits[k, :, : 16 - 2 - k].flatten(0, 1), ids[:, 2 + k :].flatten())
        for k in range(K)
    )
    assert torch.allclose(loss, expected, atol=1e-5)


def test_loss_mask_and_document_boundaries_are_respected():
    ids, mask, pos = batch(B=1, T=12)
    heads, hidden = oracle(ids)
    mask[0, 5] = 0  # token 5 is not a label
    _, metrics = medusa_loss(heads, hidden, ids, mask, pos)
    assert metrics.count[0] == 12 - 2 - 1
    # Two packed documents, 0..6 and 7..11: no label crosses the boundary.
    packed = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]])
    _, metrics = medusa_loss(heads, hidden, ids, torch.ones(1, 12), packed)
    assert metrics.count == [(7 - 2) + (5 - 2), (7 - 3) + (5 - 3), (7 - 4) + (5 - 4)]


def test_target_labels_read_the_targets_distribution_at_t_plus_1_plus_k():
    ids, mask, pos = batch()
    heads, hidden = random_heads(seed=1)
    # A perfect target: its logits at p put all mass on x_{p+1}.
    target_logits = torch.full((3, 16, V), -1e4)
    target_logits[:, :-1].scatter_(-1, ids[:, 1:, None], 0.0)
    soft, soft_metrics = medusa_loss(heads, hidden, ids, mask, pos, target_logits=target_logits)
    hard, hard_metrics = medusa_loss(heads, hidden, ids, mask, pos)
    assert torch.allclose(soft, hard, atol=1e-5)
    assert soft_metrics.top1 == hard_metrics.top1


def test_target_top1_labels_are_the_targets_top_token_at_t_plus_1_plus_k():
    ids, mask, pos = batch()
    heads, hidden = random_heads(seed=1)
    # An unsure target whose top token at p is x_{p+1}: its top-1 labels are the data's, its soft ones not.
    target_logits = torch.randn(3, 16, V, generator=torch.Generator().manual_seed(2))
    target_logits[:, :-1].scatter_(-1, ids[:, 1:, None], 5.0)
    top1, top1_metrics = medusa_loss(
        heads, hidden, ids, mask, pos, target_logits=target_logits, target_top1=True
    )
    data, data_metrics = medusa_loss(heads, hidden, ids, mask, pos)
    soft, _ = medusa_loss(heads, hidden, ids, mask, pos, target_logits=target_logits)
    assert torch.allclose(top1, data, atol=1e-5) and top1_metrics.top1 == data_metrics.top1
    assert not torch.allclose(top1, soft, atol=1e-2)
    # Where the target's top token is not the data's, the label follows the target.
    other = (ids + 1) % V
    target_logits[:, :-1].scatter_(-1, other[:, 1:, None], 9.0)
    moved, _ = medusa_loss(heads, hidden, other, mask, pos, target_logits=target_logits, target_top1=True)
    kept, _ = medusa_loss(heads, hidden, ids, mask, pos, target_logits=target_logits, target_top1=True)
    assert torch.allclose(moved, kept, atol=1e-6)  # the data's tokens no longer matter
    assert not torch.allclose(kept, data, atol=1e-2)


def test_simulated_accept_length():
    assert simulated_accept_length([]) == 1.0
    assert simulated_accept_length([0.5, 0.5]) == pytest.approx(1.75)
    assert simulated_accept_length([1.0, 1.0, 1.0]) == 4.0
