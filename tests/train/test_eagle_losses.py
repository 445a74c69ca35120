"""EAGLE losses: which feature and token go in at t and which are the labels, noise, TTT step masks,
the draft vocabulary's out-of-vocabulary positions."""

import datasets
import pytest
import torch
from torch import nn

from specheads.data.packing import collate, shift_loss_mask
from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from
from specheads.train.eagle_losses import (
    DraftMetrics,
    count_label_tokens,
    draft_attention_mask,
    eagle3_loss,
    eagle3_unroll,
    eagle_loss,
    topk_teacher,
    ttt_step_mask,
)
from specheads.train.losses import soft_labels, soft_topk_cross_entropy, teacher_cross_entropy

from helpers import tiny_config

B, T, H, V = 2, 10, 8, 12
MIN = torch.finfo(torch.float32).min


def batch(packing=False, seed=0):
    """Two rows; packed: row 0 holds two documents (7 + 3 tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [[7, 3], [10]] if packing else [[10], [8]]
    examples = [
        {"input_ids": torch.randint(0, V, (n,), generator=g).tolist(), "loss_mask": [0] + [1] * (n - 1)}
        for row in lengths
        for n in row
    ]
    return collate(examples, pad_token_id=0, packing=packing, max_length=T)


class OracleHead(nn.Module):
    """Stands in for EagleHead: returns whatever `predict(call, features, embeds, positions)` says, and
    records its inputs."""

    method = "eagle"

    def __init__(self, predict):
        super().__init__()
        self.fc = nn.Linear(1, 1)
        self.predict, self.calls = predict, []

    def forward(self, features, input_embeds, position_ids, attention_mask, cache=None):
        self.calls.append(
            dict(features=features, embeds=input_embeds, positions=position_ids, mask=attention_mask)
        )
        return self.predict(len(self.calls) - 1, features, input_embeds, position_ids)

    def logits(self, predicted, lm_head=None):
        return predicted if lm_head is None else lm_head(predicted)

    def embed(self, embed_tokens, ids):
        return embed_tokens(ids)


def embedding():
    torch.manual_seed(0)
    return nn.Embedding(V, H)


# -- EAGLE-1/2 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("packing", [False, True])
def test_eagle_shifts(packing):
    """At t the head reads f_t and embed(x_{t+1}); its label is f_{t+1} and the target's distribution at
    t+1; t is trained when x_{t+2} is a label of the same document."""
    data = batch(packing)
    hidden = torch.randn(B, T, H)
    lm_head, embed = nn.Linear(H, V, bias=False), embedding()
    target_logits = lm_head(hidden).detach()
    next_feature = torch.cat([hidden[:, 1:], hidden[:, -1:]], 1)
    oracle = OracleHead(lambda _i, *_: next_feature)  # predicts f_{t+1} exactly
    args = (hidden, data["input_ids"], data["loss_mask"], data["position_ids"], target_logits, embed, lm_head)
    loss, metrics = eagle_loss(oracle, *args, attention_mask=data["attention_mask"], noise=0.0)
    valid = shift_loss_mask(data["loss_mask"], data["position_ids"], 2) > 0
    b, t = valid.nonzero(as_tuple=True)
    # inputs: f_t and embed(x_{t+1})
    seen = oracle.calls[0]
    assert torch.equal(seen["features"], hidden)
    assert torch.equal(seen["embeds"][:, :-1], embed(data["input_ids"][:, 1:]))
    # labels: a perfect prediction of f_{t+1} costs exactly the entropy of the target at t+1
    teacher = target_logits[b, t + 1].softmax(-1)
    entropy = -(teacher * teacher.log()).sum(-1).mean()
    assert metrics.feature == [0.0] and metrics.count == [float(len(b))] and metrics.top1 == [len(b)]
    assert loss.item() == pytest.approx(0.1 * entropy.item(), rel=1e-5)
    # one position late (f_t instead of f_{t+1}) is not free
    late, _ = eagle_loss(
        OracleHead(lambda _i, f, *_: f), *args, attention_mask=data["attention_mask"], noise=0
    )
    assert late.item() > loss.item() + 0.01
    # the last two positions of every document are never trained: x_{t+2} is not in it
    last = (data["position_ids"][:, 1:] == 0).nonzero().tolist()  # [row, a document's last position]
    assert len(last) == packing
    for row, end in last:
        assert not valid[row, end - 1 : end + 1].any() and valid[row, end - 2]
    assert not valid[:, -2:].any()


def test_eagle_noise_is_uniform_unscaled_and_off_at_eval():
    data = batch()
    lm_head, embed = nn.Linear(H, V, bias=False), embedding()
    for length in (4, T):
        hidden = torch.randn(B, length, H)
        oracle = OracleHead(lambda _i, f, *_: f)
        args = (
            data["input_ids"][:, :length],
            data["loss_mask"][:, :length],
            data["position_ids"][:, :length],
        )
        eagle_loss(oracle, hidden, *args, lm_head(hidden).detach(), embed, lm_head, noise=0.3)
        noise = oracle.calls[0]["features"] - hidden
        assert noise.abs().max() <= 0.3 + 1e-6 and noise.abs().max() > 0.25  # U(-0.3, 0.3), any length
        assert noise.mean().abs() < 0.05
        oracle.eval()
        eagle_loss(oracle, hidden, *args, lm_head(hidden).detach(), embed, lm_head, noise=0.3)
        assert torch.equal(oracle.calls[1]["features"], hidden)


def test_eagle_head_loss_is_deterministic_at_eval_only():
    torch.manual_seed(0)
    head = EagleHead(
        EagleConfig(layer_config_from(tiny_config("llama", vocab_size=V, hidden_size=H, head_dim=2)))
    )
    data, hidden = batch(), torch.randn(B, T, H)
    lm_head, embed = nn.Linear(H, V, bias=False), embedding()
    args = (hidden, data["input_ids"], data["loss_mask"], data["position_ids"], lm_head(hidden).detach())
    run = lambda: eagle_loss(head, *args, embed, lm_head, attention_mask=data["attention_mask"])[0].item()  # noqa: E731
    assert run() != run()  # training: fresh noise
    head.eval()
    assert run() == run()


# -- EAGLE-3 ------------------------------------------------------------------------------------------


def test_ttt_step_masks():
    first = draft_attention_mask(None, torch.arange(3).expand(1, 3), torch.float32)  # causal, T = 3
    allowed = ttt_step_mask(first, 2)[0, 0] == 0  # (3, 9): step-0 keys, step-1 keys, step-2 keys
    expected = torch.tensor(
        [
            [1, 0, 0, 1, 0, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)
    assert ttt_step_mask(first, 0).shape == (1, 1, 3, 3)
    # packed documents: step 0 stays inside each document
    data = batch(packing=True)
    first = draft_attention_mask(data["attention_mask"], data["position_ids"], torch.float32)
    row, end = (data["position_ids"][:, 1:] == 0).nonzero()[0].tolist()  # document 1 ends at `end`
    mask = ttt_step_mask(first, 1)[row, 0]
    assert (mask[end + 1 :, : end + 1] == MIN).all() and (mask[end + 1, end + 1] == 0)


def test_eagle3_step_sees_only_what_it_may():
    """Step i at t depends on g_0..g_t and x_0..x_{t+1+i}; never on g_{t+1}.. or on x_{t+2+i} (its label)."""
    torch.manual_seed(0)
    config = tiny_config("llama", vocab_size=V, hidden_size=H, head_dim=2, num_attention_heads=4)
    head = Eagle3Head(
        Eagle3Config(layer_config_from(config), draft_vocab_size=V, target_layers=(1, 2, 3))
    ).eval()
    pos = torch.arange(T)[None]
    first = draft_attention_mask(None, pos, torch.float32)
    fused, embeds = torch.randn(1, T, H), torch.randn(1, T, H)
    steps = 3
    base = eagle3_unroll(head, fused, embeds, pos, first, steps)
    t = 4
    for i in range(steps):
        for what, index in (("fused", t + 1), ("embeds", t + 2 + i)):
            f, e = fused.clone(), embeds.clone()
            (f if what == "fused" else e)[:, index:] = torch.randn(1, T - index, H)
            out = eagle3_unroll(head, f, e, pos, first, steps)[i]
            assert torch.allclose(out[:, : t + 1], base[i][:, : t + 1], atol=1e-5), (i, what)
        e = embeds.clone()
        e[:, t + 1 + i] = torch.randn(H)  # its own input token: must matter
        assert not torch.allclose(eagle3_unroll(head, fused, e, pos, first, steps)[i][:, t], base[i][:, t])


def draft_head(vocab) -> Eagle3Head:
    """An EAGLE-3 head over the tiny shapes, seeded, its draft vocabulary the 6 target ids `vocab`."""
    torch.manual_seed(0)
    config = tiny_config("llama", vocab_size=V, hidden_size=H, head_dim=2, num_attention_heads=4)
    head = Eagle3Head(Eagle3Config(layer_config_from(config), draft_vocab_size=6, target_layers=(1, 2, 3)))
    return head.set_draft_vocab(torch.tensor(list(vocab)))


def test_eagle3_shifts_and_positions():
    """Step i at t reads embed(x_{t+1+i}) at position p_t + i; its label is the target at t+1+i."""
    data = batch()
    target_logits = torch.randn(B, T, V)
    t2d = torch.ones(V, dtype=torch.bool)
    labels = [
        torch.cat([target_logits[:, 1 + i :], target_logits[:, -1:].expand(-1, 1 + i, -1)], 1)
        for i in range(3)
    ]
    oracle = OracleHead(lambda i, *_: labels[i])  # perfect at every step
    oracle.t2d, oracle.capture_layers = t2d, (1,)
    oracle.input_hidden = lambda f: f[1]
    oracle.to_target_ids, oracle.vocab_target_ids = (lambda ids: ids), (lambda: torch.arange(V))
    embed = embedding()
    loss, metrics = eagle3_loss(
        oracle, {1: torch.randn(B, T, V)}, data["input_ids"], data["loss_mask"], data["position_ids"],
        target_logits, embed, attention_mask=data["attention_mask"], steps=3,
    )  # fmt: skip
    for i, call in enumerate(oracle.calls):
        assert torch.equal(call["embeds"][:, : T - 1 - i], embed(data["input_ids"][:, 1 + i :]))
        assert torch.equal(call["positions"], data["position_ids"] + i)
        assert call["mask"].shape == (B, 1, T, (i + 1) * T)
        assert (
            metrics.top1[i]
            == metrics.count[i]
            == shift_loss_mask(data["loss_mask"], data["position_ids"], 2 + i).sum()
        )
    assert metrics.count == [8 + 6, 7 + 5, 6 + 4]  # rows of 10 and 8 tokens, labels from the second
    entropy = sum(
        0.8**i * (-(p * p.log()).sum(-1)).mean()
        for i in range(3)
        for valid in [shift_loss_mask(data["loss_mask"], data["position_ids"], 2 + i) > 0]
        for p in [
            target_logits[valid.nonzero(as_tuple=True)[0], valid.nonzero(as_tuple=True)[1] + 1 + i].softmax(
                -1
            )
        ]
    )
    assert loss.item() == pytest.approx(entropy.item(), rel=1e-5)


def test_eagle3_reads_the_draft_vocabulary_columns_and_the_argmax_alone():
    """Given the target's top tokens, the loss takes its logits as the draft vocabulary's columns (what a
    kept held-out batch gives: train/held_out.py): the same loss and metrics as from the full logits."""
    head = draft_head([0, 2, 3, 5, 7, 11])
    data = batch()
    target_logits = torch.randn(B, T, V)
    target_logits[0, 4, 9] = 50.0  # a top token outside the draft vocabulary: skipped either way
    features = {i: torch.randn(B, T, H) for i in (1, 2, 3)}
    args = (features, data["input_ids"], data["loss_mask"], data["position_ids"])
    full, m_full = eagle3_loss(head, *args, target_logits, embedding(), steps=2, temperature=1.5)
    columns = target_logits[..., head.vocab_target_ids()]
    tops = target_logits.argmax(-1)
    cut, m_cut = eagle3_loss(head, *args, columns, embedding(), steps=2, temperature=1.5, target_tokens=tops)
    assert torch.equal(full, cut) and torch.equal(m_full.as_tensor(), m_cut.as_tensor())
    # the columns' own argmax is not the target's top token where it lies outside them
    wrong, m_wrong = eagle3_loss(
        head, *args, columns, embedding(), steps=2, temperature=1.5, target_tokens=columns.argmax(-1)
    )
    assert not torch.equal(m_full.as_tensor(), m_wrong.as_tensor())
    with pytest.raises(ValueError, match="must hold the draft vocabulary.s 6 columns, got 12"):
        eagle3_loss(head, *args, target_logits, embedding(), steps=2, target_tokens=tops)


def test_eagle3_counts_positions_outside_the_draft_vocabulary():
    head = draft_head(range(6))  # tokens 0..5
    data = batch()
    target_logits = torch.randn(B, T, V)
    target_logits[0, 4, 9] = 50.0  # the target's token after position 4 of row 0 is 9: not draftable
    features = {i: torch.randn(B, T, H) for i in (1, 2, 3)}
    args = (features, data["input_ids"], data["loss_mask"], data["position_ids"])
    loss, metrics = eagle3_loss(head, *args, target_logits, embedding(), steps=2)
    out_of_vocab = ~head.t2d[target_logits.argmax(-1)]
    for i in range(2):
        valid = shift_loss_mask(data["loss_mask"], data["position_ids"], 2 + i) > 0
        b, t = valid.nonzero(as_tuple=True)
        assert metrics.out_of_vocab[i] == out_of_vocab[b, t + 1 + i].sum() > 0
        assert metrics.count[i] == len(b)  # counted as positions (and misses), not dropped
    summary = DraftMetrics.summarise(metrics.as_tensor(), [1.0, 0.8], topk=5)
    assert summary["step0/out_of_vocab"] == metrics.out_of_vocab[0] / metrics.count[0]
    assert summary["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("mode", ["skip", "train"])
def test_eagle3_out_of_vocab_positions_are_skipped_or_trained(mode):
    """out_of_vocab "skip" (ours) leaves out the positions whose target token the draft vocabulary lacks;
    "train" (Model Optimizer's) trains every labelled position against the target's distribution
    renormalised over the draft vocabulary. Each step's loss is the mean soft-CE over the trained positions,
    recomputed here from the head's own unrolled outputs."""
    head = draft_head([0, 2, 3, 5, 8, 9])
    data, target_logits = batch(), torch.randn(B, T, V)
    features = {i: torch.randn(B, T, H) for i in (1, 2, 3)}
    emb, mask = embedding(), data["attention_mask"]
    loss, metrics = eagle3_loss(head, features, data["input_ids"], data["loss_mask"], data["position_ids"],
                                target_logits, emb, attention_mask=mask, steps=2, out_of_vocab=mode)  # fmt: skip
    with torch.no_grad():
        fused = head.input_hidden(features)
        attention = draft_attention_mask(mask, data["position_ids"], fused.dtype)
        outputs = eagle3_unroll(head, fused, emb(data["input_ids"]), data["position_ids"], attention, 2)
    teacher = target_logits[..., head.vocab_target_ids()].softmax(-1)
    emittable = head.t2d[target_logits.argmax(-1)]
    expected = 0.0
    for i, h in enumerate(outputs):
        b, t = (shift_loss_mask(data["loss_mask"], data["position_ids"], 2 + i) > 0).nonzero(as_tuple=True)
        ce = -(teacher[b, t + 1 + i] * head.logits(h[b, t]).detach().log_softmax(-1)).sum(-1)
        keep = emittable[b, t + 1 + i] if mode == "skip" else torch.ones_like(ce, dtype=torch.bool)
        expected += 0.8**i * ce[keep].mean()
        assert 0 < metrics.out_of_vocab[i] == (~emittable[b, t + 1 + i]).sum()  # counted either way
        assert metrics.trained[i] == keep.sum() and metrics.count[i] == len(b)
    assert loss.item() == pytest.approx(float(expected), rel=1e-5)
    summary = DraftMetrics.summarise(metrics.as_tensor(), [1.0, 0.8], topk=5)
    assert summary["loss"] == pytest.approx(loss.item(), rel=1e-5)
    with pytest.raises(ValueError, match="out_of_vocab must be one of .*, got 'drop'"):
        eagle3_loss(head, features, data["input_ids"], data["loss_mask"], data["position_ids"], target_logits,
                    emb, steps=1, out_of_vocab="drop")  # fmt: skip


def test_eagle3_teacher_temperature():
    """Labels softmax(target logits / T): T 2 is the soft loss on halved logits; T 0 the cross-entropy on the
    target's top token, i.e. the soft loss against a one-hot teacher (the logits sharpened to their argmax),
    over the same kept positions."""
    head = draft_head([0, 2, 3, 5, 8, 9])
    data = batch()
    target_logits = torch.randn(B, T, V)
    features = {i: torch.randn(B, T, H) for i in (1, 2, 3)}
    args = (head, features, data["input_ids"], data["loss_mask"], data["position_ids"])
    top1, m_top1 = eagle3_loss(*args, target_logits, embedding(), steps=2, temperature=0)
    warm, _ = eagle3_loss(*args, target_logits, embedding(), steps=2, temperature=2)
    halved, _ = eagle3_loss(*args, target_logits / 2, embedding(), steps=2)
    assert warm.item() == pytest.approx(halved.item(), rel=1e-6)
    sharp, m_sharp = eagle3_loss(*args, target_logits * 1e4, embedding(), steps=2)
    soft, _ = eagle3_loss(*args, target_logits, embedding(), steps=2)
    assert top1.item() == pytest.approx(sharp.item(), rel=1e-5)
    assert abs(top1.item() - soft.item()) > 0.05  # a one-hot teacher is not the distribution
    assert m_top1.count == m_sharp.count and m_top1.out_of_vocab == m_sharp.out_of_vocab
    assert m_top1.out_of_vocab[0] > 0  # the mask that keeps positions is exercised


def test_topk_teacher_and_soft_topk_cross_entropy_are_hass_term():
    """topk_teacher: the target's K most likely ids and their probabilities at T 1 (not renormalised over the
    K). soft_topk_cross_entropy: -sum soft log q - w sum_K p log q, its written-out backward equal to
    autograd's through the plain formula (gradcheck in float64); all K at T 1 is (1 + w) x the soft loss."""
    g = torch.Generator().manual_seed(0)
    logits, teacher = torch.randn(5, 9, generator=g), torch.randn(5, 9, generator=g)
    top, p = topk_teacher(teacher, 3)
    assert torch.equal(top, teacher.argsort(-1, descending=True)[:, :3])
    assert torch.allclose(p, teacher.softmax(-1).gather(-1, top))
    soft = soft_labels(teacher, 1.5)
    assert torch.allclose(soft, (teacher / 1.5).softmax(-1))
    x = logits.clone().requires_grad_()
    fused = soft_topk_cross_entropy(x, soft, top, p, 0.7)
    fused.sum().backward()
    y = logits.clone().requires_grad_()
    log_q = y.log_softmax(-1)
    plain = -(soft * log_q).sum(-1) - 0.7 * (p * log_q.gather(-1, top)).sum(-1)
    plain.sum().backward()
    assert torch.allclose(fused, plain, atol=1e-6) and torch.allclose(x.grad, y.grad, atol=1e-6)
    assert torch.allclose(
        fused, teacher_cross_entropy(logits, teacher, 1.5) - 0.7 * (p * log_q.gather(-1, top)).sum(-1)
    )
    d = logits.double().requires_grad_()
    weights = torch.randn(5, dtype=torch.float64)  # a non-uniform upstream gradient
    assert torch.autograd.gradcheck(
        lambda z: soft_topk_cross_entropy(z, soft.double(), top, p.double(), 0.7) * weights, (d,)
    )
    every, p_every = topk_teacher(teacher, 50)  # K past V: all V
    assert every.shape == (5, 9)
    whole = soft_topk_cross_entropy(logits, soft_labels(teacher, 1), every, p_every, 0.5)
    assert torch.allclose(whole, 1.5 * teacher_cross_entropy(logits, teacher), rtol=1e-5)
    one_hot = soft_labels(teacher, 0)
    assert torch.equal(one_hot.argmax(-1), teacher.argmax(-1)) and torch.equal(one_hot.sum(-1), torch.ones(5))


def test_eagle3_topk_loss_adds_the_hass_term_at_every_step():
    """topk_loss K, weight w: each kept position's loss gains w x the top-K term, at every step. With K the
    whole draft vocabulary and the teacher at T 1, that term is the soft loss itself: the loss is (1 + w)
    times the plain one; with a one-hot teacher any K gives the same; weight 0 changes nothing."""
    head = draft_head([0, 2, 3, 5, 8, 9])
    data = batch()
    target_logits = torch.randn(B, T, V)
    features = {i: torch.randn(B, T, H) for i in (1, 2, 3)}
    args = (head, features, data["input_ids"], data["loss_mask"], data["position_ids"])
    plain, m_plain = eagle3_loss(*args, target_logits, embedding(), steps=3)
    whole, m_whole = eagle3_loss(
        *args, target_logits, embedding(), steps=3, topk_loss=6, topk_loss_weight=0.5
    )
    assert whole.item() == pytest.approx(1.5 * plain.item(), rel=1e-5)
    assert m_whole.count == m_plain.count and m_whole.trained == m_plain.trained
    assert m_plain.out_of_vocab[0] > 0  # skipped positions stay out of the added term too
    top2, _ = eagle3_loss(*args, target_logits, embedding(), steps=3, topk_loss=2)
    assert plain.item() < top2.item() < 2 * plain.item()  # a part of the soft loss added
    warm, _ = eagle3_loss(*args, target_logits, embedding(), steps=3, temperature=1.5)
    warm_top2, _ = eagle3_loss(*args, target_logits, embedding(), steps=3, temperature=1.5, topk_loss=2)
    top2_term = top2.item() - plain.item()  # p at T 1 whatever the soft labels' temperature
    assert warm_top2.item() - warm.item() == pytest.approx(top2_term, rel=1e-5)
    sharp, _ = eagle3_loss(*args, target_logits * 1e4, embedding(), steps=3)
    sharp_top3, _ = eagle3_loss(*args, target_logits * 1e4, embedding(), steps=3, topk_loss=3)
    assert sharp_top3.item() == pytest.approx(2 * sharp.item(), rel=1e-5)
    off, _ = eagle3_loss(*args, target_logits, embedding(), steps=3, topk_loss=2, topk_loss_weight=0)
    assert off.item() == pytest.approx(plain.item(), rel=1e-6)


def test_count_label_tokens():
    rows = [
        {"input_ids": [1, 2, 2, 3], "loss_mask": [0, 1, 1, 1]},
        {"input_ids": [3, 3], "loss_mask": [1, 0]},
    ]
    assert count_label_tokens(rows, 5).tolist() == [0, 0, 2, 2, 0]
    # A datasets.Dataset is read in Arrow batches, through its index mapping (select / shuffle).
    ds = datasets.Dataset.from_list(rows + [{"input_ids": [4, 4, 4], "loss_mask": [1, 1, 1]}])
    assert count_label_tokens(ds, 5).tolist() == [0, 0, 2, 2, 3]
    assert count_label_tokens(ds.select([2, 1]), 5).tolist() == [0, 0, 0, 1, 3]


def test_eagle3_noise_is_on_each_captured_layer_and_off_at_eval():
    """eagle3_noise: U(-a, a) on every captured layer before fc (step 0's input), fresh each call, none at
    eval and none by default."""
    data = batch()
    captured = {1: torch.randn(B, T, H), 3: torch.randn(B, T, H)}
    seen = []
    oracle = OracleHead(lambda i, *_: torch.zeros(B, T, V))
    oracle.t2d, oracle.capture_layers = torch.ones(V, dtype=torch.bool), (1, 3)
    oracle.input_hidden = lambda f: seen.append(f) or f[1]
    oracle.to_target_ids, oracle.vocab_target_ids = (lambda ids: ids), (lambda: torch.arange(V))
    args = (data["input_ids"], data["loss_mask"], data["position_ids"], torch.randn(B, T, V), embedding())
    for noise in (0.3, 0.3, 0.0):
        eagle3_loss(oracle, captured, *args, steps=1, noise=noise)
    for layer in (1, 3):
        drawn = seen[0][layer] - captured[layer]
        assert 0.25 < drawn.abs().max() <= 0.3 + 1e-6 and drawn.mean().abs() < 0.05, layer
        assert not torch.equal(seen[0][layer], seen[1][layer])  # fresh noise each call
        assert torch.equal(seen[2][layer], captured[layer])
    oracle.eval()
    eagle3_loss(oracle, captured, *args, steps=1, noise=0.3)
    assert all(torch.equal(seen[3][i], captured[i]) for i in (1, 3))
    eagle3_loss(oracle.train(), captured, *args, steps=1)  # the default: none (the paper's EAGLE-3)
    assert all(torch.equal(seen[4][i], captured[i]) for i in (1, 3))
